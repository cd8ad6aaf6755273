"""Live-byte tracing of a forward (and backward) pass on fake tensors: nothing is allocated for real.

A ``TorchDispatchMode`` sees every tensor an op returns; each distinct storage is counted while it lives (a weak
reference's callback takes it off again), so the profile is what an allocator would hold after every op,
whatever the module does. Parameters and buffers are registered up front and not counted: the model states are
computed exactly by ``states.py``. Gradients are told apart from activations as autograd accumulates them, so
sharding can scale them separately.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import re
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from torch.utils._python_dispatch import TorchDispatchMode

from dtypecheck.errors import DtypecheckError, InputError
from dtypecheck.memory.inventory import distinct_parameters
from dtypecheck.memory.routing import DataDependentOpError, Shadows, tensors_in
from dtypecheck.memory.workspaces import held_output_bytes, op_name, real_workspace_bytes, run_op, workspace_output
from dtypecheck.training_step import DEFAULT_LOSS, StepLoss, forward_and_loss, watching_targets

if TYPE_CHECKING:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode


class Profile(Protocol):
    """What the estimate needs from a traced pass."""

    @property
    def peak_activations(self) -> int: ...

    @property
    def retained_bytes(self) -> int: ...

    def peak(self, gradient_scale: float = 1.0) -> int: ...

    @property
    def notes(self) -> tuple[str, ...]: ...

    def ungraded_of(self, names: Sequence[str]) -> frozenset[str]:
        """Which of the model's trainable parameters ``names`` (in the inventory's order) the traced step gives no
        gradient."""
        ...


@dataclass(frozen=True)
class ActivationProfile:
    """Live bytes over one pass, beyond the model states."""

    peak_activations: int
    """The most bytes of activations (inputs, saved tensors, temporaries, outputs) alive at once."""
    frontier: tuple[tuple[int, int], ...]
    """(activation bytes, gradient bytes) at every moment that can be the peak, whatever the gradients'
    share per device: the Pareto front of the whole timeline."""
    ops: int
    retained_bytes: int = 0
    """What the training loop still references during the optimizer step: the batch, the model's output (the
    logits) and the loss, and anything the model keeps after backward."""
    notes: tuple[str, ...] = ()
    """Assumptions the trace made (balanced routing of a mixture of experts)."""
    timeline: tuple[tuple[int, int], ...] = dataclasses.field(default=(), repr=False, compare=False)
    """(activation bytes, gradient bytes) after every op, in order: ``--fit`` models each moment's growth with the
    size from traces at consecutive sizes (``scaling.py``)."""
    step: StepTrace | None = dataclasses.field(default=None, repr=False, compare=False)
    """With ``attribute``: which op, module and phase each moment belongs to, and who holds the peak."""
    ungraded: tuple[str, ...] = ()
    """The parameters that require a gradient and got none: the loss never reaches them (a head the default loss
    does not read). A torch optimizer keeps no state for them and the step holds no gradient of theirs."""
    idle: tuple[str, ...] = ()
    """The parameters no module holding them ran (in training: and that got no gradient). In a shallow copy of a deep
    model that says the copy skipped work the model does (MiniCPM-V's tower runs its merger after block 6 of 12):
    such a copy is not extrapolated from."""

    def peak(self, gradient_scale: float = 1.0) -> int:
        """Peak live bytes when each device keeps ``gradient_scale`` of the gradients (1/N under ZeRO-2)."""
        return max((a + int(g * gradient_scale) for a, g in self.frontier), default=0)

    def ungraded_of(self, names: Sequence[str]) -> frozenset[str]:
        return frozenset(self.ungraded).intersection(names)


@dataclass(frozen=True)
class StepTrace:
    """Where a traced pass's bytes are: for ``--by-module`` and ``--plot``."""

    ops: tuple[str, ...]
    """The op of every moment of ``ActivationProfile.timeline``."""
    modules: tuple[str | None, ...]
    """The dotted path of the module that ran it (for a backward op, the module whose forward made its node)."""
    backward_from: int | None
    """The first moment of the backward pass; None for inference."""
    peak_index: int
    """The moment holding the most activation and gradient bytes together."""
    held_by: tuple[tuple[str | None, int], ...]
    """Activation bytes alive at ``peak_index``, by the module whose op created them (None: the batch, and ops
    outside any module such as the loss)."""


@dataclass(frozen=True)
class ExtrapolatedProfile:
    """A model of ``layers`` identical blocks, from traces of the same model with ``base`` and ``base + 1`` blocks.

    Each block adds the same bytes at the same point of the pass, so every figure grows by the same step per
    block; ``linear_profiles`` checks that on a third trace before this is used.
    """

    smaller: ActivationProfile
    larger: ActivationProfile
    base: int
    layers: int

    def _extend(self, small: int, large: int) -> int:
        return large + (self.layers - self.base - 1) * (large - small)

    @property
    def peak_activations(self) -> int:
        return self._extend(self.smaller.peak_activations, self.larger.peak_activations)

    @property
    def retained_bytes(self) -> int:
        return self._extend(self.smaller.retained_bytes, self.larger.retained_bytes)

    def peak(self, gradient_scale: float = 1.0) -> int:
        return self._extend(self.smaller.peak(gradient_scale), self.larger.peak(gradient_scale))

    @property
    def notes(self) -> tuple[str, ...]:
        return self.larger.notes

    def ungraded_of(self, names: Sequence[str]) -> frozenset[str]:
        """The shallow traces' parameters without a gradient, grown per block like every other figure: counted per
        name with its block (and expert) numbers left out, and taken from the last blocks of ``names`` (LXMERT's
        last cross layer: its vision branch feeds nothing the loss reads). Where they do not grow that way, none:
        every parameter is counted, as if all got a gradient."""
        small, large = _ungraded_patterns(self.smaller), _ungraded_patterns(self.larger)
        candidates: dict[str, list[str]] = {}
        for name in names:
            candidates.setdefault(_numbers_left_out(name), []).append(name)
        found: set[str] = set()
        for pattern in small.keys() | large.keys():
            count = self._extend(small[pattern], large[pattern])
            among = candidates.get(pattern, [])
            if large[pattern] < small[pattern] or count > len(among):
                return frozenset()
            found.update(among[len(among) - count :])
        return frozenset(found)


_NUMBER = re.compile(r"(?:^|(?<=\.))\d+(?=\.)")


def _numbers_left_out(name: str) -> str:
    """``x_layers.3.visual_attention.weight`` -> ``x_layers.#.visual_attention.weight``."""
    return _NUMBER.sub("#", name)


def _ungraded_patterns(profile: ActivationProfile) -> collections.Counter[str]:
    return collections.Counter(_numbers_left_out(name) for name in profile.ungraded)


def linear_profiles(profiles: list[ActivationProfile]) -> bool:
    """True when consecutive block counts add the same bytes to every figure the estimate reads (and the same
    parameters without a gradient), and no module with parameters sat idle in any of them."""
    if any(p.idle for p in profiles):
        return False
    series = [[p.peak(scale) for p in profiles] for scale in (0.0, 0.125, 0.5, 1.0)]
    series.append([p.peak_activations for p in profiles])
    series.append([p.retained_bytes for p in profiles])
    patterns = [_ungraded_patterns(p) for p in profiles]
    for pattern in set().union(*patterns):
        series.append([count[pattern] for count in patterns])
    for values in series:
        steps = [b - a for a, b in itertools.pairwise(values)]
        # A scaled gradient share is rounded down to whole bytes, hence the one byte of slack.
        if max(steps) - min(steps) > 1:
            return False
    return True


class TraceDeadlineError(DtypecheckError):
    """A trace ran past the deadline ``trace_deadline`` set (``--fit``'s time bound)."""


_DEADLINE: list[tuple[float, Callable[[], float]]] = []


@contextlib.contextmanager
def trace_deadline(deadline: float | None, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """Traces started inside stop with ``TraceDeadlineError`` once ``clock()`` passes ``deadline`` (wall-clock
    time by default; ``time.process_time`` bounds the CPU time, whatever else shares the machine)."""
    if deadline is None:
        yield
        return
    _DEADLINE.append((deadline, clock))
    try:
        yield
    finally:
        _DEADLINE.pop()


class OpTraceError(InputError):
    """An op of the model that fake tensors could not run: which op, in which module, and why."""

    def __init__(self, op: str, module: str | None, cause: BaseException) -> None:
        self.op = op
        self.module = module
        self.cause = cause
        where = f" in module {module!r}" if module else ""
        if isinstance(cause, DataDependentOpError):
            why = "its output size depends on tensor values the trace does not know"
        else:
            why = f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0]}"
        super().__init__(f"{op}{where}: {why}")


NODE_KEY = "dtypecheck_memory"
"""Key in an autograd node's ``metadata``: the module whose forward created it. Kept on the node, the mapping dies
with it: holding the nodes (to keep their ids) held the graphs of modules no gradient reaches, which a plain step
frees (a tiny Encodec's encoder, cut off from the loss by its quantizer's codes: 67% more in training)."""


def _claim_nodes(output: Any, module: str) -> None:
    """Mark every autograd node behind ``output`` not yet claimed (by an inner module, which leaves first) as
    ``module``'s: the nodes its own forward created."""
    import torch
    from torch.utils._pytree import tree_flatten

    todo: list[Any] = [t.grad_fn for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None:
            continue
        metadata: dict[str, Any] = node.metadata
        if NODE_KEY in metadata:
            continue
        metadata[NODE_KEY] = module
        todo.extend(next_node for next_node, _ in node.next_functions if next_node is not None)


@contextlib.contextmanager
def module_paths(
    module: torch.nn.Module,
    stack: list[str],
    claim_nodes: bool = False,
    ran: set[int] | None = None,
) -> Iterator[None]:
    """Keep ``stack`` at the dotted paths of the submodules of ``module`` that are running; with ``claim_nodes``,
    also mark the autograd nodes each module's forward creates with its path (``NODE_KEY``, for backward ops);
    with ``ran``, add the id of every submodule that runs."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    names = {id(sub): name or type(module).__name__ for name, sub in module.named_modules()}

    def enter(sub: torch.nn.Module, _args: Any) -> None:
        if id(sub) in names:
            stack.append(names[id(sub)])
            if ran is not None:
                ran.add(id(sub))

    def leave(sub: torch.nn.Module, _args: Any, out: Any) -> None:
        if id(sub) in names and stack:
            if claim_nodes:
                _claim_nodes(out, stack[-1])
            stack.pop()

    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class LiveBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts each storage an op returns while it is alive; storages registered as external are not counted."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Nothing here is compiled: without this, torch wraps every op's dispatch in a dynamo-disable frame.
        return False

    def __init__(self, shadows: Shadows | None = None) -> None:
        import torch
        from torch._subclasses.fake_tensor import FakeTensor

        super().__init__()  # type: ignore[no-untyped-call]
        self._prim_device = torch.ops.prim.device.default
        self._fake_type = FakeTensor
        self.shadows = shadows
        self.modules: list[str] = []
        """The dotted paths of the modules running, innermost last (for errors naming where an op failed)."""
        self.activations = 0
        self.gradients = 0
        self.ops = 0
        self._storages: dict[int, tuple[int, bool]] = {}  # id -> (nbytes, is_gradient)
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._timeline: list[tuple[int, int]] = []
        self._external: list[Any] = []
        self._born: dict[int, int] = {}  # id -> the first moment of the timeline that counts it
        self.attributing = False
        """Whether to record which module each moment and each storage belongs to (``StepTrace``)."""
        self.backward_from: int | None = None
        self._op_names: list[str] = []
        self._op_modules: list[str | None] = []
        self._creator: dict[int, str | None] = {}  # storage id -> module that created it
        self._held: dict[str | None, int] = {}  # module -> activation bytes it created that are alive
        self._peak_held: tuple[int, int, dict[str | None, int]] = (-1, -1, {})  # (bytes, index, held)

    def register_external(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        self._external.append(storage)  # keeps the id stable while we run
        self._storages[id(storage)] = (0, False)

    def track(self, tensor: torch.Tensor, nbytes: int | None = None) -> None:
        """Count ``tensor``'s storage while it lives (as ``nbytes`` when the fake storage cannot tell)."""
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._storages:
            return
        nbytes = storage.nbytes() if nbytes is None else nbytes
        self._storages[key] = (nbytes, False)
        self._born[key] = len(self._timeline)
        self._refs[key] = weakref.ref(storage, functools.partial(self._release, key))
        self.activations += nbytes
        if self.attributing:
            owner = self.current_module()
            self._creator[key] = owner
            self._held[owner] = self._held.get(owner, 0) + nbytes

    def current_module(self) -> str | None:
        """The module running now: in forward the innermost one, in backward the one whose node is running."""
        if self.backward_from is None:
            return self.modules[-1] if self.modules else None
        import torch

        node: Any = torch._C._current_autograd_node()
        return None if node is None else cast("str | None", node.metadata.get(NODE_KEY))

    def hold_from_start(self, tensor: torch.Tensor) -> None:
        """Count ``tensor`` as alive since the pass began, and until it ends: a loss target made at the loss
        that a training loop loads with its batch."""
        key = id(tensor.untyped_storage())
        if key not in self._storages:
            self.track(tensor)
        nbytes, is_gradient = self._storages[key]
        born = self._born.pop(key, len(self._timeline))
        if not is_gradient:
            self._timeline[:born] = [(a + nbytes, g) for a, g in self._timeline[:born]]
            self._external.append(tensor)

    def mark_gradient(self, tensor: torch.Tensor) -> None:
        key = id(tensor.untyped_storage())
        entry = self._storages.get(key)
        if entry is None:
            self.track(tensor)
            entry = self._storages[key]
        nbytes, is_gradient = entry
        if not is_gradient and nbytes:
            self._storages[key] = (nbytes, True)
            self.activations -= nbytes
            self.gradients += nbytes
            self._forget_creator(key, nbytes)

    def _forget_creator(self, key: int, nbytes: int) -> None:
        if key in self._creator:
            owner = self._creator.pop(key)
            self._held[owner] -= nbytes

    def _release(self, key: int, _ref: object) -> None:
        nbytes, is_gradient = self._storages.pop(key, (0, False))
        self._refs.pop(key, None)
        self._born.pop(key, None)
        if is_gradient:
            self.gradients -= nbytes
        else:
            self.activations -= nbytes
            self._forget_creator(key, nbytes)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if _DEADLINE and self.ops % 64 == 0 and _DEADLINE[-1][1]() > _DEADLINE[-1][0]:
            raise TraceDeadlineError("the trace ran past its deadline")
        if func is self._prim_device and len(args) == 1 and type(args[0]) is self._fake_type:
            # ``tensor.device`` asked in C++ (most of a pass's ops: autograd asks it of every input and gradient):
            # nothing allocated, no values, so neither the shadows nor the workspaces have anything to do. The
            # fake tensor's own property answers as the fake mode's handler would.
            out = args[0].device
        else:
            out = self._run(func, args, kwargs or {})
        self.ops += 1
        self._timeline.append((self.activations, self.gradients))
        if self.attributing:
            self._op_names.append(op_name(func))
            self._op_modules.append(self.current_module())
            if self.activations + self.gradients > self._peak_held[0]:
                held = {m: b for m, b in self._held.items() if b}
                self._peak_held = (self.activations + self.gradients, len(self._timeline) - 1, held)
        return out

    def _run(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``func`` and count the storages it returns."""
        import torch

        try:
            out = self.shadows.run(func, args, kwargs, run_op) if self.shadows else run_op(func, args, kwargs)
        except DtypecheckError:
            raise
        except Exception as exc:
            raise OpTraceError(str(func), self.modules[-1] if self.modules else None, exc) from exc
        workspace = workspace_output(func)
        if workspace is not None and isinstance(out[workspace], torch.Tensor) and out[workspace].numel() == 0:
            self.track(out[workspace], real_workspace_bytes(func, workspace, args, kwargs))
        if isinstance(out, torch.Tensor):
            self.track(out, held_output_bytes(func, args, kwargs, out))
        elif isinstance(out, list | tuple):
            for tensor in tensors_in(tuple(out), {}, torch.Tensor):  # in order (a tuple may hold a ``Tensor[]``)
                self.track(tensor)
        return out

    def step_trace(self) -> StepTrace:
        _, index, held = self._peak_held
        return StepTrace(
            tuple(self._op_names),
            tuple(self._op_modules),
            self.backward_from,
            max(index, 0),
            tuple(sorted(held.items(), key=lambda item: (item[0] is not None, item[0] or ""))),
        )

    def profile(self, retained_bytes: int = 0, notes: tuple[str, ...] = ()) -> ActivationProfile:
        frontier: list[tuple[int, int]] = []
        best_gradients = -1
        # Sweep by activations, largest first: a point is on the front when it holds more gradients than
        # every point with more activations.
        for activations, gradients in sorted(set(self._timeline), reverse=True):
            if gradients > best_gradients:
                frontier.append((activations, gradients))
                best_gradients = gradients
        peak = max((a for a, _ in self._timeline), default=0)
        step = self.step_trace() if self.attributing else None
        return ActivationProfile(peak, tuple(frontier), self.ops, retained_bytes, notes, tuple(self._timeline), step)


@dataclass
class Traceable:
    """A module with fake parameters, how to make its inputs, the loss the step takes, and its blocks."""

    fake_mode: FakeTensorMode
    module: torch.nn.Module
    make_inputs: Callable[[int | None, int | None], Any]
    """``(batch_size, seq_len) -> inputs`` in the factory's own form (a tensor, a tuple, a dict of keyword
    arguments). Called under the fake mode and the tracker, so the batch itself is counted as activation memory."""
    batch_size: int | None
    seq_len: int | None = None
    loss: StepLoss = DEFAULT_LOSS
    layers: int | None = None
    """How many identical blocks the model repeats, when its config says."""
    with_layers: Callable[[int], Traceable] | None = None
    """The same model with fewer blocks, to trace a deep model from shallow copies of it."""
    prepare: Callable[[], None] | None = None
    """Makes the module's parameters fake, run before the first trace: a deep model extrapolated from shallow
    copies never pays for it."""

    def ready(self) -> Traceable:
        """Run ``prepare`` once; returns self."""
        if self.prepare is not None:
            prepare, self.prepare = self.prepare, None
            prepare()
        return self

    def inputs(self) -> Any:
        return self.make_inputs(self.batch_size, self.seq_len)

    def reshaped(self, batch_size: int | None, seq_len: int | None) -> Traceable:
        """The same model fed ``batch_size`` x ``seq_len`` inputs (its shallow copies too)."""
        shallow = self.with_layers
        return dataclasses.replace(
            self,
            batch_size=batch_size,
            seq_len=seq_len,
            with_layers=None if shallow is None else lambda n: shallow(n).reshaped(batch_size, seq_len),
        )

    def blocks(self) -> list[torch.nn.Module]:
        """The units ``--checkpointing`` recomputes: every element of the outermost ModuleLists/Sequentials."""
        from torch import nn

        found: list[nn.Module] = []
        covered: set[int] = set()
        for sub in self.module.modules():
            if id(sub) in covered:
                continue
            if isinstance(sub, nn.ModuleList | nn.Sequential) and sub is not self.module:
                found.extend(sub.children())
                covered.update(id(m) for m in sub.modules())
        if not found and isinstance(self.module, nn.Sequential):
            found = list(self.module.children())
        return found


def cast_inputs(inputs: Any, dtype: torch.dtype | None) -> Any:
    """Floating inputs in the dtype the weights are in (as a pure-bfloat16 training loop feeds them)."""
    import torch
    from torch.utils._pytree import tree_map

    if dtype is None:
        return inputs

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        return value

    return tree_map(cast, inputs)


@contextlib.contextmanager
def scalars_as_numbers() -> Iterator[None]:
    """``torch.tensor(values)`` whose values hold fake one-element tensors (M-RoPE's ``torch.tensor(deltas)`` of
    traced ``max() + 1`` scalars) takes their numbers through ``.item()``: ``torch.tensor`` reads its elements'
    data, which fake tensors have none of, while ``.item()`` answers from a known value (or stops the trace as
    data-dependent)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.tensor

    def number(value: Any) -> Any:
        if isinstance(value, FakeTensor) and value.numel() == 1:
            return value.item()
        if isinstance(value, list | tuple):
            return type(value)(number(v) for v in value)
        return value

    def tensor(data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return original(number(data) if isinstance(data, list | tuple) else data, *args, **kwargs)

    torch.tensor = tensor
    try:
        yield
    finally:
        torch.tensor = original


@contextlib.contextmanager
def known_values_not_traced(shadows: Shadows) -> Iterator[None]:
    """transformers' ``is_tracing(tensor)`` answers False for a fake tensor whose values the shadows know, as it
    does on the real run's tensors: the model takes its eager path, reading the values through ``.item()``.

    transformers counts every ``FakeTensor`` as traced and then takes its export-safe paths, which allocate what
    the eager run does not: ``create_causal_mask`` without a cache (``use_cache=False``) takes a fake
    ``position_ids`` as packed sequences and materialises a (batch, 1, seq, seq) boolean mask and its float copy
    where the real run passes ``is_causal=True`` to SDPA and no mask (LLaVA-NeXT's inference at 512 tokens:
    +139% against MemTracker, 2.2 of 0.93 MB). A fake tensor of unknown values still counts as traced."""
    import sys

    utils = sys.modules.get("transformers.utils.import_utils")
    original = getattr(utils, "is_fake_tensor", None)
    if original is None:
        yield
        return

    def is_fake_tensor(value: Any) -> bool:
        return bool(original(value)) and value not in shadows.values

    utils.is_fake_tensor = is_fake_tensor  # type: ignore[union-attr]
    try:
        yield
    finally:
        utils.is_fake_tensor = original  # type: ignore[union-attr]


@contextlib.contextmanager
def checkpointed(blocks: list[torch.nn.Module]) -> Iterator[None]:
    """Non-reentrant activation checkpointing of each block, undone afterwards."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        original = block.forward
        block.forward = functools.partial(checkpoint, original, use_reentrant=False)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward


def trace_pass(
    traceable: Traceable,
    *,
    train: bool,
    autocast_dtype: torch.dtype | None,
    checkpointing: bool,
    input_dtype: torch.dtype | None = None,
    attribute: bool = False,
) -> ActivationProfile:
    """Run one forward (and, when training, backward) pass on fake tensors and return its live-byte profile
    (with ``attribute``, also which module holds what: its ``step``).

    The module's floating parameters must already be in the dtype the pass computes in.
    """
    import torch
    from torch.utils._pytree import tree_flatten

    module = traceable.module
    shadows = Shadows(traceable.fake_mode)
    tracker = LiveBytes(shadows)
    tracker.attributing = attribute
    for tensor in (*module.parameters(), *module.buffers()):
        tracker.register_external(tensor)
        constant = getattr(tensor, "constant_value", None)
        if constant is not None:
            shadows.values[tensor] = constant  # a constant the constructor made (fakes.fakify_module)
    hooks = []
    graded: set[int] = set()

    def accumulated(param: torch.Tensor) -> None:
        graded.add(id(param))
        if param.grad is not None:
            tracker.mark_gradient(param.grad)

    if train:
        for param in module.parameters():
            if param.requires_grad:
                hooks.append(param.register_post_accumulate_grad_hook(accumulated))  # type: ignore[no-untyped-call]
    module.train(train)
    grad_mode = torch.enable_grad() if train else torch.no_grad()
    block_list = traceable.blocks() if (checkpointing and train) else []
    try:
        ran: set[int] = set()
        paths = module_paths(module, tracker.modules, claim_nodes=attribute, ran=ran)
        with (
            traceable.fake_mode,
            tracker,
            grad_mode,
            checkpointed(block_list),
            paths,
            watching_targets(tracker.hold_from_start),
            scalars_as_numbers(),
            known_values_not_traced(shadows),
        ):
            inputs = cast_inputs(traceable.inputs(), input_dtype)
            shadows.forget_data(inputs)
            for value in tree_flatten(inputs)[0]:
                if isinstance(value, torch.Tensor):
                    tracker.track(value)
            autocast = (
                torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
            )
            # The batch, the output and the loss stay referenced through backward and the optimizer step, as
            # in a training loop's ``logits = model(x); loss = loss_fn(logits, y); loss.backward()``.
            output, loss = forward_and_loss(module, inputs, traceable.loss if train else None, autocast)
            if loss is not None:
                tracker.backward_from = tracker.ops
                loss.backward()  # type: ignore[no-untyped-call]
            retained = tracker.activations
            del output, loss, inputs
        ungraded: list[str] = []
        idle: list[str] = []
        # A tied parameter ran when any module holding it ran (T5's ``shared`` embedding never runs itself: its
        # weight runs as ``encoder.embed_tokens``).
        reached = {
            id(param)
            for _, sub in module.named_modules(remove_duplicate=False)
            if id(sub) in ran
            for param in sub.parameters(recurse=False)
        }
        for name, param, _ in distinct_parameters(module):
            if train and id(param) in graded:
                continue
            if train and param.requires_grad:
                ungraded.append(name)
            if id(param) not in reached:
                idle.append(name)
    finally:
        for handle in hooks:
            handle.remove()
        for param in module.parameters():
            param.grad = None
    return dataclasses.replace(tracker.profile(retained, shadows.notes()), ungraded=tuple(ungraded), idle=tuple(idle))
