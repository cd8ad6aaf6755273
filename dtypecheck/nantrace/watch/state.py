"""What watch mode keeps per step: fused finiteness checks, and the state a failing step is replayed from.

Nothing is written to the parameters before the optimizer step, so a step whose loss or gradients went non-finite
is replayed from the unchanged parameters with what this module saves when the step's first model call starts:
the RNG states, the buffers that training changes (batch-norm statistics), the call's arguments (references, with
their version counters) and, once backward has run, the gradient that flowed into the model's output. A NaN born
inside the optimizer step needs the parameters and optimizer states from before it: ``OptimizerSnapshot`` copies
them into buffers allocated once.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from dtypecheck.nantrace import native
from dtypecheck.nantrace.frames import FrameKey
from dtypecheck.nantrace.ops import tensor_list
from dtypecheck.nantrace.records import readable

if TYPE_CHECKING:
    import torch
    from torch import nn


Flag: TypeAlias = "torch.Tensor | bool | None"
"""A finiteness check's answer: a bool when it was read on the host already (the C++ checks), an on-device flag
still to be read back (``read_flags`` reads them all at once), or None when there was nothing floating."""


def all_finite(tensors: list[torch.Tensor]) -> Flag:
    """Whether every floating tensor is finite, without writing to any of them (no version counter moves: a loss
    or a tensor saved for backward may be among them) and without a host sync.

    CPU tensors go through the C++ checks when they are built (``native``: one call for the whole list, ~0.1 us a
    tensor); otherwise one fused reduction per device (the tensors flattened into one, and its ``aminmax``: NaN
    propagates and inf is its own extreme), where one op per tensor cost ~1 us each.

    A sharded tensor (FSDP2's DTensor) is checked as the shard this rank holds: each rank checks its own, with no
    collective (a reduction of the whole DTensor is one collective per tensor, and failed on a rank whose shard is
    empty), and the distributed session tells the other ranks what one found."""
    if not tensors:
        return None
    native = _native()
    found = _native_answer(native, tensors)
    if found >= 0:
        return bool(found)
    local = _shards(tensors)
    if local is not tensors:
        tensors = local
        found = _native_answer(native, tensors)
        if found >= 0:
            return bool(found)
    return _fused_all_finite(tensors)


def _native_answer(native: Any, tensors: list[torch.Tensor]) -> int:
    """``native.all_finite``'s answer, or -1 without the module or where it cannot read one of them."""
    if native is None:
        return -1
    try:
        return int(native.all_finite(tensors))
    except (TypeError, RuntimeError):
        return -1


def _shards(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each sharded tensor as this rank's shard (``_local``); the list itself when none is sharded."""
    local = [_local(t) for t in tensors]
    return tensors if all(a is b for a, b in zip(local, tensors, strict=True)) else local


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor (one with ``to_local``: FSDP2's DTensor), the tensor that holds its
    values (written through by a ``copy_`` into it); any other tensor itself."""
    import torch

    if type(tensor) is torch.Tensor:
        return tensor
    to_local = getattr(tensor, "to_local", None)
    if to_local is None:
        return tensor
    with torch.no_grad():  # (with gradients on, a view made by an autograd function)
        return to_local()  # type: ignore[no-any-return]


def _fused_all_finite(tensors: list[torch.Tensor]) -> Flag:
    import torch

    groups: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        # A tensor whose storage FSDP freed (a module may still hold one when a run ends) has no values to check,
        # and reading it crashed the process (the C++ checks' ``plain_of`` refuses it the same way).
        if tensor.is_floating_point() and tensor.numel() and readable(tensor, storage_less=True):
            groups.setdefault(tensor.device, []).append(tensor)
    flags = []
    with torch.no_grad():
        for device, group in groups.items():
            if device.type == "meta":
                continue
            try:
                # Mixed float dtypes are promoted to the widest, which holds every value exactly (inf and NaN too).
                lo, hi = torch.aminmax(torch._C._nn.flatten_dense_tensors(group))
                flags.append(torch.stack((lo, hi)).isfinite().all())
            except (RuntimeError, NotImplementedError, TypeError):
                # A tensor subclass (DTensor), a float8 format or a backend without them: one max-norm per tensor,
                # float8 widened first (float32 holds its every value, inf and NaN too; CPU has no float8 amax).
                flags.append(torch.stack([_widened(t).abs().amax().isfinite() for t in group]).all())
    if not flags:
        return None
    return flags[0] if len(flags) == 1 else torch.stack([f.to("cpu").reshape(()) for f in flags]).all()


def _widened(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    detached = tensor.detach()
    return detached.to(torch.float32) if detached.element_size() == 1 else detached


def read_flags(flags: list[Flag]) -> bool:
    """Whether every flag is true: one read-back for all of the on-device ones."""
    import torch

    present = []
    for flag in flags:
        if flag is None or flag is True:
            continue
        if flag is False:
            return False
        present.append(flag.to("cpu").reshape(()))
    return not present or bool(torch.stack(present).all())


def _native() -> Any:
    """The C++ checks, or None (off, not built, or unbuildable)."""
    return native.load()


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit the same where both are finite, and non-finite somewhere in both or in neither: a replay must
    reproduce the step, not approximate it, but a matrix kernel may spread one NaN over more or fewer elements
    from one call to the next (its blocking differs), so where the NaNs land is not compared."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = _local(a), _local(b)  # a sharded gradient (FSDP2): this rank's shards, which boolean indexing can read
    with torch.no_grad():
        finite_a, finite_b = a.isfinite(), b.isfinite()
        both = finite_a & finite_b
        return bool(finite_a.all() == finite_b.all()) and bool((a[both] == b[both]).all())


@dataclass
class RngState:
    cpu: torch.Tensor
    cuda: list[torch.Tensor] | None

    @classmethod
    def take(cls) -> RngState:
        import torch

        # ``torch.cuda.is_initialized()`` is a Python call a step; its flag is read directly where torch has it.
        initialized = getattr(torch.cuda, "_initialized", None)
        if initialized is None:
            initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        cuda = torch.cuda.get_rng_state_all() if initialized else None
        return cls(torch.default_generator.get_state(), cuda)  # ``torch.get_rng_state()``, a call less

    def put_back(self) -> None:
        import torch

        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)

    @property
    def nbytes(self) -> int:
        if self.cuda is None:
            return int(self.cpu.nbytes)
        return int(self.cpu.nbytes + sum(t.nbytes for t in self.cuda))


@functools.cache
def _autocast_devices() -> tuple[str, ...]:
    import torch

    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


@dataclass
class AutocastState:
    """The autocast settings a model call ran under, to replay it under the same."""

    modes: tuple[tuple[str, bool, Any], ...]

    @classmethod
    def take(cls) -> AutocastState:
        import torch

        modes = []
        for device in _autocast_devices():
            modes.append((device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)))
        return cls(tuple(modes))

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        import torch

        with contextlib.ExitStack() as stack:
            for device, enabled, dtype in self.modes:
                stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled))
            yield


@dataclass
class ModelCall:
    """One outermost module call with gradients on, in the step being watched."""

    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    versions: list[tuple[torch.Tensor, int]]
    """The tensor arguments' version counters: changed by the time of the replay means the batch was overwritten."""
    autocast: AutocastState
    grads: dict[int, torch.Tensor] = field(default_factory=dict)
    """The gradient backward sent into the call's output tensors, by position among them (the Python hook's)."""
    kept: dict[int, Any] = field(default_factory=dict)
    """The same, held by the C++ hook (``native.keep_grad``) until asked for (``gradients``)."""
    output_finite: bool | None = None
    """Whether the replayed call's outputs came out finite (None before its replay)."""
    where: FrameKey | None = None
    """The user's line that made the call: the replay's ops are named there, not at the hook that replays them
    (a library module's ops have no line of the user's own below the call)."""

    @property
    def grads_nbytes(self) -> int:
        """The bytes of the gradients kept (asked each step: the C++ holders answer without a tensor to wrap)."""
        held = 0
        for grad in self.grads.values():
            held += grad.nbytes
        for holder in self.kept.values():
            held += holder.nbytes
        return held

    def gradients(self) -> dict[int, torch.Tensor]:
        """The gradients that came into the call's outputs, by position, from whichever hook kept them."""
        if not self.kept:
            return self.grads
        found = dict(self.grads)
        for position, holder in self.kept.items():
            grad = holder.grad
            if grad is not None:
                found[position] = grad
        return found

    def arguments_unchanged(self) -> bool:
        return all(t._version == v for t, v in self.versions)


def call_of(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], where: FrameKey | None = None
) -> ModelCall:
    arguments = tensor_list(args)
    if kwargs:
        arguments += tensor_list(kwargs)
    versions = []
    for tensor in arguments:
        versions.append((tensor, tensor._version))
    return ModelCall(module, args, dict(kwargs), versions, AutocastState.take(), where=where)


def _modules_of(module: nn.Module) -> list[nn.Module]:
    """``list(module.modules())``, in its order (pre-order, each module once), without building the dotted names
    that ``named_modules`` makes on the way."""
    seen: set[int] = set()
    found: list[nn.Module] = []
    stack = [module]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        stack.extend(child for child in reversed(current._modules.values()) if child is not None)
    return found


def _buffers_in(modules: list[nn.Module]) -> list[torch.Tensor]:
    """Their buffers, each once, in ``module.buffers()``'s order."""
    seen: set[int] = set()
    found: list[torch.Tensor] = []
    for current in modules:
        for buffer in current._buffers.values():
            if buffer is not None and id(buffer) not in seen:
                seen.add(id(buffer))
                found.append(buffer)
    return found


def _buffers_of(module: nn.Module) -> list[torch.Tensor]:
    """``list(module.buffers())``: a third of watch mode's per-step cost in the model calls when ``named_modules``
    built the dotted names on the way."""
    return _buffers_in(_modules_of(module))


class _Tree:
    """A module's buffers (``_buffers_of``), read once and kept while its tree holds: no module or buffer registered
    anywhere since and no ``_apply`` (``module.to()``) or ``insert``/``del`` of a container, which write the dicts
    directly (``BufferSnapshot.install`` counts them all), and each buffer still the same tensor. Walking the tree
    at each step's first model call was a tenth of watch mode's cost on a small model (issue 30.5)."""

    def __init__(self, module: nn.Module, generation: int) -> None:
        self.module = weakref.ref(module)
        """Kept by ``id``: another module may later have this one's."""
        self.generation = generation
        modules = _modules_of(module)
        self.buffers = _buffers_in(modules)
        self.entries = [(m._buffers, key, b) for m in modules for key, b in m._buffers.items() if b is not None]

    def holds(self, generation: int) -> bool:
        if generation != self.generation:
            return False
        return not self.entries or all(held.get(key) is buffer for held, key, buffer in self.entries)


DIRECT_WRITERS = (
    ("Module", "_apply"),
    ("ModuleList", "insert"),
    ("ModuleList", "__delitem__"),
    ("Sequential", "insert"),
    ("Sequential", "__delitem__"),
)
"""The methods of ``torch.nn`` that write a module's ``_buffers`` or ``_modules`` without torch's registration hooks."""


class BufferSnapshot:
    """The buffers of the watched models as a step began. Only buffers that the first step changed are copied
    (batch-norm statistics, counters): a causal mask is never written, and copying it each step would cost for
    nothing. In the first step, before anything is known, all of them are; a buffer first changed later is
    noticed by its version counter, and its replay is then not exact."""

    def __init__(self) -> None:
        self._changing: set[int] = set()
        self._learned = False
        self._saved: list[tuple[torch.Tensor, torch.Tensor | None, int]] = []
        self._copied = 0
        """The bytes of the copies in ``_saved``."""
        self._trees: dict[int, _Tree] = {}
        self._generation = 0
        """Changes to any module tree while watching: registrations, and the direct writers patched."""
        self._counted = False

    def install(self, patch: Callable[[Any, str, Callable[[Any], Any]], None]) -> list[Any]:
        """Count every change to a module tree from now on; the registration hooks' handles to remove. Without
        the hooks (an older torch) every step walks the tree."""
        from torch import nn
        from torch.nn.modules import module as module_module

        handles = []
        for name in ("register_module_buffer_registration_hook", "register_module_module_registration_hook"):
            register = getattr(module_module, name, None)
            if register is not None:
                handles.append(register(self._changed))
        self._counted = len(handles) == 2
        if self._counted:
            for owner, method in DIRECT_WRITERS:
                patch(getattr(nn, owner), method, self._counting)
        return handles

    def _changed(self, *_: Any) -> None:
        self._generation += 1

    def _counting(self, original: Any) -> Any:
        snapshot = self

        @functools.wraps(original)
        def method(*args: Any, **kwargs: Any) -> Any:
            snapshot._generation += 1
            return original(*args, **kwargs)

        return method

    def clear(self) -> None:
        self._saved = []
        self._copied = 0

    def _listed(self, module: nn.Module) -> list[torch.Tensor]:
        """``_buffers_of(module)``, from its kept ``_Tree`` while that holds."""
        if not self._counted:
            return _buffers_of(module)
        tree = self._trees.get(id(module))
        if tree is None or tree.module() is not module or not tree.holds(self._generation):
            tree = self._trees[id(module)] = _Tree(module, self._generation)
        return tree.buffers

    def take(self, module: nn.Module) -> None:
        for buffer in self._listed(module):
            copy = buffer.detach().clone() if not self._learned or id(buffer) in self._changing else None
            if copy is not None:
                self._copied += copy.nbytes
            self._saved.append((buffer, copy, buffer._version))

    def step_ended(self) -> None:
        import torch

        for buffer, saved, version in self._saved:
            # Batch norm updates its running statistics inside its kernel without bumping their version counter:
            # what changed is learned from the values, in the first step.
            changed = saved is not None and not self._learned and not torch.equal(buffer, saved)
            if changed or buffer._version != version:
                self._changing.add(id(buffer))
        self._learned = self._learned or bool(self._saved)

    def put_back(self) -> bool:
        """Restore the buffers; False when one changed that was not copied (the replay is then not exact)."""
        import torch

        exact = True
        with torch.no_grad():
            for buffer, copy, version in self._saved:
                if copy is not None:
                    buffer.copy_(copy)
                elif buffer._version != version:
                    exact = False
        return exact

    @property
    def nbytes(self) -> int:
        return self._copied


class OptimizerSnapshot:
    """An optimizer's parameters and state tensors before its update, copied each step into one allocation per
    (device, dtype) made once per layout, each tensor on lines of its own: on CPU by one C++ call
    (``native.Snapshot``, whose stores bypass the cache), otherwise with ``_foreach_copy_``. The state an optimizer
    creates at its first step is noted as absent; plain values in its state (a Python step counter) are copied as
    they are."""

    def __init__(self, *, copies: bool = True) -> None:
        self.copies = copies
        """False: only the layout (what an update writes, for the check after it) is kept, no copy."""
        self._layouts: dict[int, _Layout] = {}
        self._nbytes = 0
        self._taken: dict[int, tuple[_Layout, list[Any]]] = {}
        """By optimizer: the layout the snapshot was taken in, and the plain values of its state before the update
        in its ``plain`` order. Its own layout, not the latest: the check after a first update builds a new one
        (the state grew), whose buffers for the new state tensors were never filled, and putting those back wrote
        uninitialised memory into the states (issue 30.4: a NaN "input" in ``lerp_`` instead of the inf born in
        ``addcdiv_``, answers that changed from run to run, an OverflowError in Adam's ``beta1 ** step``)."""

    def layout(self, optimizer: Any) -> _Layout:
        """Built again only when the optimizer's state grew (its first step creates it) or its groups changed:
        walking every parameter's state each step was most of watch mode's cost on a small model."""
        import torch

        signature = [len(optimizer.state)]
        for group in optimizer.param_groups:
            signature.append(len(group["params"]))
        layout = self._layouts.get(id(optimizer))
        if layout is not None and layout.signature == signature:
            return layout
        tensors: list[torch.Tensor] = []
        keys: dict[int, set[str]] = {}
        plain: list[tuple[dict[str, Any], str]] = []
        parameters: list[torch.Tensor] = []
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                parameters.append(parameter)
                # A sharded parameter or state (FSDP2) is copied and checked as this rank's shard: its update is
                # local, and DTensor has no sharding rule for ``_foreach_copy_``.
                tensors.append(_local(parameter.detach()))
                state = optimizer.state.get(parameter, {})
                keys[id(parameter)] = set(state)
                for key, value in state.items():
                    if isinstance(value, torch.Tensor):
                        tensors.append(_local(value.detach()))
                    else:
                        plain.append((state, key))
        sources = list(_by_kind(tensors).values())
        copies = [_Copies.of(group) if self.copies else None for group in sources]
        layout = _Layout(signature, sources, copies, keys, plain, parameters)
        self._layouts[id(optimizer)] = layout
        self._count()
        return layout

    def take(self, optimizer: Any, layout: _Layout | None = None) -> None:
        import torch

        layout = layout or self.layout(optimizer)
        groups = layout.native
        for index, copies in enumerate(layout.copies):
            if copies is None:
                continue
            # The C++ copy is one streamed memcpy a tensor, where _foreach_copy_ dispatches one copy_ each on CPU
            # (under no_grad only there: entering it each step was a tenth of this method's cost).
            snapshot = groups.snapshots[index] if groups is not None else None
            if snapshot is None or not snapshot.take():
                with torch.no_grad():
                    torch._foreach_copy_(copies.views, layout.sources[index])
        plain = [copy.deepcopy(state[key]) for state, key in layout.plain] if layout.plain else []
        before = self._taken.get(id(optimizer))
        self._taken[id(optimizer)] = (layout, plain)
        if before is None or before[0] is not layout:
            self._count()

    def put_back(self, optimizer: Any) -> bool:
        """Restore the optimizer to its state before the update; False when no snapshot of it was taken."""
        import torch

        taken = self._taken.get(id(optimizer))
        if taken is None:
            return False
        layout, values = taken
        with torch.no_grad():
            for source, copies in zip(layout.sources, layout.copies, strict=True):
                if copies is not None:
                    torch._foreach_copy_(source, copies.views)
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                state = optimizer.state.get(parameter)
                if state is None:
                    continue
                for key in set(state) - layout.keys.get(id(parameter), set()):
                    del state[key]  # created by the update being replayed: absent before it
                if not state:
                    del optimizer.state[parameter]
        for (state, key), value in zip(layout.plain, values, strict=True):
            state[key] = value
        return True

    def written_finite(self, optimizer: Any) -> Flag:
        """``all_finite`` of what an update writes (the parameters and the optimizer's floating state tensors), by
        the C++ group the layout holds where it has one."""
        layout = self.layout(optimizer)
        groups = layout.native
        found = groups.floating.finite() if groups is not None else -1
        return bool(found) if found >= 0 else all_finite(layout.floating)

    def grads_finite(self, optimizer: Any, layout: _Layout | None = None) -> Flag:
        """``all_finite`` of the gradients the optimizer's parameters have (``layout``: its layout, already found)."""
        layout = layout or self.layout(optimizer)
        groups = layout.native
        found = groups.parameters.grads_finite() if groups is not None else -1
        return bool(found) if found >= 0 else all_finite([p.grad for p in layout.parameters if p.grad is not None])

    @property
    def nbytes(self) -> int:
        """The copies' allocations held now: the latest layout's of each optimizer, and the one a snapshot was
        taken in where that is older (counted when either changes, not at each ask: asked every step)."""
        return self._nbytes

    def _count(self) -> None:
        layouts = {id(layout): layout for layout in self._layouts.values()}
        layouts.update((id(layout), layout) for layout, _ in self._taken.values())
        self._nbytes = sum(c.nbytes for layout in layouts.values() for c in layout.copies if c is not None)


LINE = 64
"""Bytes a copy of the snapshot starts on a multiple of (``native.Snapshot`` streams whole lines)."""


@dataclass(frozen=True)
class _Copies:
    """The snapshot of one (device, dtype) group: one allocation (``flat``, bytes) and, when asked for, a view of it
    shaped as each tensor (``views``: only ``_foreach_copy_`` and a replay's ``put_back`` need them, and making ~200
    views cost ~1.2 ms each time an optimizer's layout was built, twice in a run's first steps); or, for a tensor
    subclass or a dtype that bytes cannot be viewed as, a tensor each (``own``; ``flat`` None)."""

    flat: torch.Tensor | None
    offsets: list[int]
    shapes: list[tuple[torch.dtype, torch.Size, int]]
    own: list[torch.Tensor] | None = None

    @classmethod
    def of(cls, tensors: list[torch.Tensor]) -> _Copies:
        import torch

        offsets, total = [], 0
        for tensor in tensors:
            offsets.append(total)
            total += -(-tensor.nbytes // LINE) * LINE
        shapes = [(t.dtype, t.shape, int(t.nbytes)) for t in tensors]
        if any(type(t) is not torch.Tensor for t in tensors) or not _bytes_view_as(tensors[0].dtype):
            # A subclass (a DTensor shard of FSDP2, a fake tensor) is copied into its own kind (``empty_like``): a
            # plain view would be mixed with it in ``copy_``.
            return cls(None, offsets, shapes, [torch.empty_like(t, requires_grad=False) for t in tensors])
        return cls(torch.empty(total, dtype=torch.uint8, device=tensors[0].device), offsets, shapes)

    @functools.cached_property
    def views(self) -> list[torch.Tensor]:
        if self.own is not None or self.flat is None:
            return self.own or []
        flat = self.flat
        return [
            flat[at : at + nbytes].view(dtype).view(shape)
            for (dtype, shape, nbytes), at in zip(self.shapes, self.offsets, strict=True)
        ]

    @property
    def nbytes(self) -> int:
        return int(self.flat.nbytes) if self.flat is not None else sum(int(v.nbytes) for v in self.own or ())


@functools.cache
def _bytes_view_as(dtype: torch.dtype) -> bool:
    """Whether bytes can be viewed as ``dtype`` (not a quantized one, say): asked once per dtype."""
    import torch

    try:
        torch.empty(LINE, dtype=torch.uint8)[:LINE].view(dtype)
    except (RuntimeError, TypeError):
        return False
    return True


@dataclass
class _Layout:
    signature: list[int]
    """The optimizer's state's length, then each param group's parameter count."""
    sources: list[list[torch.Tensor]]
    """The parameters and state tensors, grouped by (device, dtype)."""
    copies: list[_Copies | None]
    """Each group's snapshot (None where no copies are kept)."""
    keys: dict[int, set[str]]
    """By parameter: its state's keys when the layout was built."""
    plain: list[tuple[dict[str, Any], str]]
    """Where the state holds a plain value (not a tensor)."""
    parameters: list[torch.Tensor]
    """The optimizer's parameters themselves (not detached: their ``.grad`` is read)."""
    floating: list[torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        self.floating = [t for group in self.sources if group[0].is_floating_point() for t in group]

    @functools.cached_property
    def native(self) -> _NativeGroups | None:
        """The same tensors held by the C++ module (built at the first ask), or None without it."""
        module = _native()
        group = getattr(module, "Group", None)
        snapshot = getattr(module, "Snapshot", None)
        if group is None or snapshot is None:
            return None
        return _NativeGroups(
            [
                None if c is None or c.flat is None or c.flat.device.type != "cpu" else snapshot(s, c.flat, c.offsets)
                for s, c in zip(self.sources, self.copies, strict=True)
            ],
            group(self.floating),
            group(self.parameters),
        )


@dataclass(frozen=True)
class _NativeGroups:
    """A layout's tensors as held by the C++ module: copied and checked without passing a list each step."""

    snapshots: list[Any]
    """Each group's ``native.Snapshot`` (None for a group on another device, or without copies)."""
    floating: Any
    parameters: Any


def _by_kind(tensors: list[torch.Tensor]) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    return groups
