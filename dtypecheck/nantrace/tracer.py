"""The cheap pass: a dispatch mode that sees every aten op (forward, backward, optimizer) and defers its checks.

Per op it takes an on-device ``aminmax`` of each floating output (one NaN-propagating reduction gives NaN, inf and
the largest magnitude), a frame walk for the user's line, and the module on top of the stack; nothing is read back
until a window of ops is full, the phase changes (forward -> backward), or tracing ends. Only then are the ops
judged, and only the one that fired is re-run in detail.

Where the C++ per-op path is built (``native/dispatch.cpp``), the mode's ops are offered to it first: it runs and
books the clean ones without Python and hands this class everything it must judge, so that the reports are the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtypecheck.nantrace import native
from dtypecheck.nantrace.autocast import AutocastInside
from dtypecheck.nantrace.checks import max_of
from dtypecheck.nantrace.defaults import DefaultDtypeWatch, dtype_name
from dtypecheck.nantrace.dtypeflow import DtypeFlow
from dtypecheck.nantrace.eager import run_compile_eagerly
from dtypecheck.nantrace.explain import explain
from dtypecheck.nantrace.frames import FrameFinder, FrameKey, location_of
from dtypecheck.nantrace.judge import NODE_KEY, Judge, written_tensors
from dtypecheck.nantrace.modules import ModuleStack
from dtypecheck.nantrace.ops import OpInfo, OpKind, classify, iter_tensors, mutated_argument
from dtypecheck.nantrace.options import TraceOptions
from dtypecheck.nantrace.raised import RaiseWatch
from dtypecheck.nantrace.records import CHECKED_DTYPES_NAMES, HALF_NAMES, Checked, OpRecord, plain, version_of
from dtypecheck.nantrace.report import Event, NanTraceReport, RaisedException, ScaleCollapse, SkippedStep
from dtypecheck.nantrace.training import TrainingWatch, untraced
from dtypecheck.nantrace.workers import WorkerWatch, merge_workers

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode


_CPU_HELD = 32 << 20
"""A window of CPU outputs is read back once it keeps this much alive, well before ``held_bytes``: reading back is
no device sync there, and memory held past its natural lifetime is memory the allocator cannot reuse. Holding up to
512 MiB doubled the page faults of benchmarks/bench_nantrace.py's transformer (190k -> 370k, 0.4 s more system
time); at 32 MiB its traced loop went from 1.20x to 1.12x the plain loop's CPU time."""


class StopTracing(BaseException):
    """Raised into the traced code at the first event to end the run (a BaseException, so that the user's own
    ``except Exception`` cannot swallow it)."""


def _dispatch_mode_class() -> type[TorchDispatchMode]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class CheckMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch >= 2.6 wraps __torch_dispatch__ in two torch._dynamo.disable layers, so that dynamo never
            # compiles it; under tracing nothing compiles (eager.run_compile_eagerly). The wrappers cost ~2 us
            # per op (a third of the small-ops run's tracing time) and their first call imports torch._dynamo
            # (~0.9 s of CPU, a third of a small script's whole run).
            return False

        def __init__(self, tracer: Tracer) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.tracer = tracer

        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            tracer = self.tracer
            try:
                return tracer.dispatch(func, args, kwargs or {})
            except RuntimeError as exc:  # zero cost until an op raises (Python >= 3.11)
                tracer.op_raised(func, args, kwargs or {}, exc)
                raise
            finally:
                if tracer._native is not None:
                    tracer._native.stale()  # what the C++ path reads of the tracer may have changed

    return CheckMode


class Tracer:
    """``with Tracer(...) as t:`` traces the block; ``t.report`` is the result (also from ``dtypecheck.trace()``)."""

    def __init__(
        self,
        options: TraceOptions | None = None,
        *,
        module_names: dict[int, str] | None = None,
        model: nn.Module | None = None,
    ) -> None:
        import torch

        self.options = options or TraceOptions()
        self.frames = FrameFinder()
        self.flow = DtypeFlow(self.frames, lower_names=("float32", "float16", "bfloat16"))
        self.defaults = DefaultDtypeWatch(self.frames, restore_default=self.options.restore_default_dtype)
        self._model = model
        self.raises = RaiseWatch(self.flow, self.frames)
        self.modules = ModuleStack(module_names, on_root=self.flow.root_started, on_raise=self.raises.module_raised)
        self.raises.modules = self.modules
        self.judge = Judge(
            history=self.options.history,
            warn_frac=self.options.warn_frac,
            keep_going=self.options.keep_going,
            owner_of=self.modules.owner_of,
            rank=self.options.rank,
        )
        self.training = TrainingWatch(self)
        self.workers = WorkerWatch(self, worker_init=TracedWorkerInit)
        self.skipped_steps: list[SkippedStep] = []
        self.scale_collapse: ScaleCollapse | None = None
        self._skip_streak: list[SkippedStep] = []
        self.ops = 0
        self.compile_calls = 0
        self.stopped = False
        self._winding_up = False
        """Another rank failed: trace on to this rank's next landmark (the end of its update, its next backward),
        judge what it ran, then stop. Set from the distributed watcher's thread."""
        self._wound_up = False
        """Stopped by another rank's failure: the run's end is judged as if the traced code had ended there."""
        self._step = 1
        self._in_backward = False
        self._window: list[OpRecord] = []
        self._unsettled: list[Checked] = []
        """The checks of the last op's in-place outputs, whose version counters autograd has still to bump."""
        self._to_tag: OpRecord | None = None
        """The last forward record: its output gets its autograd node once dispatch returns, so the node is tagged
        at the next op, on either path (the C++ path asks for it when ``_native_state`` says so)."""
        self._recent: dict[int, Checked] = {}
        """This window's checks by ``id`` of the tensor: an in-place op need not re-check an unchanged target."""
        self._held = 0
        self._held_cpu = 0
        """Bytes of CPU outputs the window keeps alive (also counted in ``_held``)."""
        self._infos: dict[Any, OpInfo] = {}
        self._checked_dtypes = frozenset(getattr(torch, n) for n in CHECKED_DTYPES_NAMES)
        self._half = {getattr(torch, n): _tiny(n) for n in HALF_NAMES}
        # torch < 2.1 cannot say which node is running: every op then counts as forward/other.
        self._current_node = getattr(torch._C, "_current_autograd_node", lambda: None)
        self._aminmax = torch.aminmax
        self._extrema = getattr(native.load(), "extrema", None)
        """The C++ check of a CPU output (``native``), or None: torch's ops check it."""
        self._strided = torch.strided
        self._tensor = torch.Tensor
        self._is_grad_enabled = torch.is_grad_enabled
        self.autocast = AutocastInside()
        self._mode: Any = None
        self._native: Any = None
        """The C++ per-op path (``native/dispatch.cpp``) while it takes this tracer's ops, else None."""
        self._fast_held = 0
        """Bytes the C++ path's share of the window counts (read at each op the Python mode takes)."""
        self._dirty = False
        """A record of this window holds a non-finite value or one not read yet: until it is judged (and what it
        made followed), the C++ path leaves every op to the Python mode."""
        self._restore: list[tuple[Any, str, Any]] = []
        self._report: NanTraceReport | None = None
        self.raised: RaisedException | None = None
        """The exception the traced code died of (reported when a non-finite value was found before it)."""

    # -- context -----------------------------------------------------------------------------------------------
    def __enter__(self) -> Tracer:
        self._restore += run_compile_eagerly(self)
        self._restore += self.autocast.install()
        self.defaults.install()
        if self._model is not None:
            self.flow.root_started(self._model)
        self.modules.install()
        self.training.install()
        self.workers.install()
        self._mode = _dispatch_mode_class()(self)
        self._attach_native()
        self._mode.__enter__()
        return self

    def _attach_native(self) -> None:
        """Let the C++ path take the ops it can vouch for (``native/dispatch.cpp``): not while another tracer
        holds it, nor under a torch it was not built for."""
        hook = native.load_dispatch()
        options = self.options
        limits = [(dtype, self._half.get(dtype, 0.0), max_of(dtype)) for dtype in self._checked_dtypes]
        if hook is None or not hook.attach(
            self._mode, self, NODE_KEY, options.warn_frac, options.window, options.held_bytes, _CPU_HELD, limits
        ):
            return
        self._native = hook
        for func, info in self._infos.items():
            self._teach(func, info)
        self.modules.on_change = hook.module
        self.autocast.on_change = hook.stale
        self.flow.on_change = hook.dominant

    def _detach_native(self) -> None:
        if self._native is not None:
            self._native.detach()
            self._native = None
            self.modules.on_change = None
            self.autocast.on_change = None
            self.flow.on_change = None

    def _teach(self, func: Any, info: OpInfo) -> None:
        """Tell the C++ path what ``ops.classify`` says of ``func`` (the schema positions of what it writes)."""
        try:
            names = [argument.name for argument in func._schema.arguments]
            read_mutated = [w if isinstance(w, int) else names.index(w) for w in info.read_mutated]
            written = [w if isinstance(w, int) else names.index(w) for w in info.written]
            self._native.learn(func, _KIND_CODES[info.kind], info.creates, read_mutated, written, info.name)
        except (AttributeError, RuntimeError, ValueError):  # not a dispatcher op: the Python mode keeps it
            return

    def _native_state(self) -> tuple[bool, bool, str | None, int, int, int, Any, bool, bool]:
        """What the C++ path needs of this side (it asks after ``stale``): whether it may take ops at all (not
        while stopped, while autocast may be on, while a non-finite value is followed or a window holds one, or
        while an in-place op's versions are unsettled), the phase, the module, this side's share of the window,
        the program's dominant dtype (and whether a model's parameters confirmed it), and whether a forward record
        of this side waits for its node to be tagged (``_tag_pending``, called from C++ at the next op)."""
        fast = not (self.stopped or self.autocast.maybe or self.judge.taint.storages or self._unsettled or self._dirty)
        window = len(self._window)
        flow = self.flow
        return (
            fast,
            self._in_backward,
            self.modules.current,
            window,
            self._held,
            self._held_cpu,
            flow.dominant,
            flow.confirmed,
            self._to_tag is not None,
        )

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        try:
            self._mode.__exit__(None, None, None)
            if self._native is not None:
                self.ops = self._native.count()
            self._winding_up = False  # the traced code ended: what it ran is judged below, as in any run
            if not _ended_normally(exc):
                assert exc is not None
                # The script died (often of the NaN itself: BCE, multinomial, an index, its own assert): what the
                # window holds is judged, never raising StopTracing over the script's own exception.
                self.raised = raised_exception(exc, self.frames)
                if not self.stopped:
                    self.judge_now()
                    self.judge.settle(final=True, raised=True)
            elif not self.stopped or self._wound_up:
                self.flush()
                if not self.judge.stopped:  # no failure found in the flush (a stop there set self.stopped)
                    self.judge.settle(final=True)
        finally:
            self._detach_native()
            self.workers.remove()
            self.training.remove()
            self.modules.remove()
            self.defaults.remove()
            for owner, name, value in reversed(self._restore):
                setattr(owner, name, value)
            self._restore.clear()

    # -- the cheap pass ----------------------------------------------------------------------------------------
    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        hook = self._native
        adopted = None
        if hook is None:
            self.ops += 1
        else:
            # The C++ path counts every op; one it ran already and hands over to be judged comes with its output.
            adopted = hook.take()
            self.ops = hook.claim()
        if self._to_tag is not None:
            self._tag_pending()
        if self.stopped:
            return self._run(func, args, kwargs) if adopted is None else adopted[0]
        if self._unsettled:
            self._settle_versions()
        info = self._infos.get(func)
        if info is None:
            info = self._infos[func] = classify(func)
            if hook is not None:
                self._teach(func, info)
        node = self._current_node()
        backward = node is not None
        if backward != self._in_backward:
            self._phase_changed(backward)
        if info.kind is OpKind.SCALAR or info.kind is OpKind.UNINITIALISED:
            if info.creates:
                return self._made_unchecked(func, info, args, kwargs, adopted)
            return self._run(func, args, kwargs) if adopted is None else adopted[0]
        module = self.modules.current
        grad_enabled = self._is_grad_enabled()
        if info.kind is OpKind.PASS and (backward or not grad_enabled):
            if info.creates:
                return self._made_unchecked(func, info, args, kwargs, adopted)
            return self._run(func, args, kwargs) if adopted is None else adopted[0]
        origin = node.metadata.get(NODE_KEY) if node is not None else None
        # In backward the walk finds the user's .backward() call, or their own autograd.Function.backward; the
        # judge prefers the forward line recorded on the node (NODE_KEY, tagged when the forward was flushed,
        # before backward began): when it is there already the walk is only needed for the dtype watch below.
        frame = self.frames.user_frame() if origin is None else origin[0]
        record = OpRecord(self.ops - 1, func, info, node, module, frame, grad_enabled, self._step)
        record.args, record.kwargs = args, kwargs
        check = info.kind is OpKind.CHECK
        held, held_cpu = self._held, self._held_cpu
        fast_window, self._fast_held, fast_held_cpu = hook.counters() if hook is not None else _NO_SHARE
        if check:
            self._before(record, info, args, kwargs, None if adopted is None else adopted[1])
        out = self._run(func, args, kwargs) if adopted is None else adopted[0]
        result = out if isinstance(out, self._tensor) else next(iter_tensors(out), None)
        record.result = result
        if result is not None and (info.creates or result.dtype is not self.flow.dominant):
            where = (module, backward, self._step, self.ops - 1)
            walked = frame if origin is None else self.frames.user_frame()
            self.flow.after_op(func, info, (args, kwargs), result, walked, where)
        if check:
            self._after(record, out, result)
            if hook is not None and not self._dirty:
                self._dirty = any(c.lo is not None or c.nonfinite for c in (*record.pre, *record.checked))
        window = self._window
        size = len(window) + fast_window
        if size and (
            size >= self.options.window
            or self._held + self._fast_held >= self.options.held_bytes
            or self._held_cpu + fast_held_cpu >= _CPU_HELD
        ):
            # Judge the ops before this one, not this one: its output gets the grad_fn whose node must carry this
            # line into backward only once dispatch returns (judged now, its backward ops would be given the
            # .backward() line instead). It opens the next window with its bytes and its checks.
            mine, mine_cpu = self._held - held, self._held_cpu - held_cpu
            self.flush()
            self._held, self._held_cpu = mine, mine_cpu
            for checked in record.checked:
                self._recent[id(checked.tensor)] = checked
        self._window.append(record)
        if node is None:
            self._to_tag = record
        if info.written and record.checked:
            self._unsettled = record.checked
        return out

    def _run(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the op as the plain run would (autocast on for the ops its kernel calls, where it was on)."""
        return self.autocast.run(func, args, kwargs) if self.autocast.maybe else func(*args, **kwargs)

    def _tag_pending(self) -> None:
        """Tag the last forward record's node now that autograd has attached it (``Judge.tag_forward_node``)."""
        record, self._to_tag = self._to_tag, None
        if record is not None:
            self.judge.tag_forward_node(record)

    def _settle_versions(self) -> None:
        """Take the version counters of the last in-place op's outputs as it left them: autograd bumps them only
        after dispatch returns, so the one taken at the check would read as "written since" (the detailed pass
        then re-ran the op from a copy, or gave up without one; an in-place chain re-checked each link)."""
        for checked in self._unsettled:
            checked.version = version_of(checked.tensor)
        self._unsettled = []

    def _made_unchecked(
        self, func: Any, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any], adopted: Any = None
    ) -> Any:
        out = self._run(func, args, kwargs) if adopted is None else adopted[0]
        self.flow.created_outside(info, out)
        return out

    # -- dtype errors ------------------------------------------------------------------------------------------
    def op_raised(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException) -> None:
        self.raises.op_raised(self._infos.get(func) or classify(func), func, args, kwargs, exc)

    # -- the checks --------------------------------------------------------------------------------------------
    def _before(
        self,
        record: OpRecord,
        info: OpInfo,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        adopted: list[Any] | None = None,
    ) -> None:
        """``adopted``: the op ran in C++ already, which checked (and copied) its in-place targets before."""
        # Run before every checked op: written for speed (locals, no helper calls in the common case).
        written: set[int] = set()
        if info.written:
            for where in info.written:
                for tensor in iter_tensors(mutated_argument(args, kwargs, where)):
                    written.add(id(tensor))
            pres = iter(adopted) if adopted is not None else None
            for where in info.read_mutated:
                for tensor in iter_tensors(mutated_argument(args, kwargs, where)):
                    if pres is None:
                        self._before_overwrite(record, tensor)
                    else:
                        self._adopt_pre(record, tensor, next(pres, None))
        inputs = record.inputs
        tensor_type = self._tensor
        for value in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(value, tensor_type):
                if value.is_floating_point() and id(value) not in written:
                    inputs.append(_with_version(value))
            elif isinstance(value, list | tuple):
                for item in value:
                    if isinstance(item, tensor_type) and item.is_floating_point() and id(item) not in written:
                        inputs.append(_with_version(item))

    def _before_overwrite(self, record: OpRecord, tensor: torch.Tensor) -> None:
        """``tensor`` is read and then overwritten by the op: check it now."""
        # Unchanged since an earlier op of this window wrote it (an optimizer's chain of in-place updates
        # on one state): that op's check already says what this one reads.
        local = plain(tensor)
        earlier = self._recent.get(id(local))
        if earlier is not None and earlier.tensor is local and earlier.version == version_of(local):
            checked: Checked | None = earlier
        else:
            checked = self._check(tensor)
        if checked is not None:
            record.pre.append(checked)
            # The op is about to overwrite what it reads: keep a copy for the detailed re-run.
            if self._room_for_copy(record, tensor):
                record.clones[id(tensor)] = tensor.detach().clone()

    def _room_for_copy(self, record: OpRecord, tensor: torch.Tensor) -> bool:
        """Whether a copy of ``tensor`` as the op found it is kept for the detailed re-run (its bytes then count
        in the window): not where it would hold too much (a fused optimizer updating every state at once), nor in
        the optimizer step (no grad, outside every module): copying each parameter and state before each update
        was a tenth of a transformer step's tracing time, for a cause only (null there)."""
        keep = record.grad_enabled or record.module is not None
        if keep and self._held + self._fast_held + tensor.nbytes <= self.options.held_bytes:
            self._held += tensor.nbytes
            return True
        return False

    def _adopt_pre(self, record: OpRecord, tensor: torch.Tensor, found: tuple[Any, ...] | None) -> None:
        """``_before_overwrite`` for an op the C++ path ran: its check of ``tensor`` before the op, and copy."""
        if found is None:
            return
        lo, hi, small, version, clone = found
        checked = Checked.read(plain(tensor), lo, hi, small)
        checked.version = version
        record.pre.append(checked)
        if clone is not None and self._room_for_copy(record, tensor):
            record.clones[id(tensor)] = clone

    def _after(self, record: OpRecord, out: Any, result: torch.Tensor | None) -> None:
        if result is not None and result is out:  # one tensor returned: the common case, without the list
            tensors: Iterable[torch.Tensor] = (result,)
        else:
            tensors = written_tensors(record, out)
        for tensor in tensors:
            checked = self._check(tensor)
            if checked is not None:
                record.checked.append(checked)
                self._recent[id(checked.tensor)] = checked
                self._held += tensor.nbytes
                if tensor.is_cpu:
                    self._held_cpu += tensor.nbytes

    def _check(self, tensor: torch.Tensor) -> Checked | None:
        local = getattr(tensor, "_local_tensor", None)  # records.plain, inlined: run for every op output
        if local is not None:
            tensor = local
        if (
            tensor.dtype not in self._checked_dtypes
            or tensor.layout is not self._strided
            or tensor.numel() == 0
            or tensor.is_meta
        ):
            return None
        extrema = self._extrema
        if extrema is not None and tensor.is_cpu:
            # The C++ check reads a dense CPU tensor in one pass (None: one it does not read), where the three ops
            # below were ~8% of a small-op model's traced step and their read-back at the flush another ~5%.
            found = extrema(tensor, self._half.get(tensor.dtype, 0.0))
            if found is not None:
                return Checked.read(tensor, *found)
        try:
            # Inside __torch_dispatch__ autograd is mostly excluded already; a tensor that still requires grad
            # is detached, so that the check never records a graph.
            detached = tensor.detach() if tensor.requires_grad else tensor
            # aminmax is ~60x slower than amin + amax on a non-contiguous tensor (a transposed view): measured with
            # benchmarks/bench_nantrace.py, it was most of the tracing cost of a transformer step.
            if detached.is_contiguous():
                lo, hi = self._aminmax(detached)
            else:
                lo, hi = detached.amin(), detached.amax()
        except (RuntimeError, NotImplementedError):
            return None  # a tensor subclass or backend without aminmax: unchecked rather than broken
        tiny = self._half.get(tensor.dtype)
        small = None if tiny is None else (detached.abs() < tiny).sum()
        return Checked(tensor, lo, hi, small)

    def _phase_changed(self, backward: bool) -> None:
        # Forward nodes must carry their line before backward runs them: flush first.
        self.flush()
        self._in_backward = backward

    def flush(self) -> None:
        """Read back the window's reductions and judge its ops; at the first failure, stop (unless keep-going).
        Not a landmark: a rank that another's failure winds up runs on, from backward into the update that reads
        what backward left."""
        self.judge_now()
        self._stop_at_failure()

    def judge_now(self) -> None:
        """Judge the window's ops without stopping the traced code (``flush`` stops it at a failure)."""
        if self._unsettled:
            self._settle_versions()
        window, self._window = self._window, []
        self._recent.clear()
        self._held = self._held_cpu = 0
        self._dirty = False
        hook = self._native
        if hook is not None:
            # The C++ path's ops of this window are judged already (clean); their history lines go in in op order.
            self.judge.judge_window(window, hook.entries)
            hook.flushed()
        elif window:
            self.judge.judge_window(window)

    def landmark_runs_ops(self) -> bool:
        """Whether judging at a landmark (``TrainingWatch``) may run torch ops, which must then not be traced: a
        window of Python records to read back or re-run, or non-finite values being followed. Without either (the
        C++ path judged the window's ops as they ran) it runs none, and turning the modes off and on around it
        (``untraced``) was a few per cent of a small model's traced step."""
        judge = self.judge
        return bool(self._window or judge.taint.storages or judge.taint.producers)

    @property
    def found_nonfinite(self) -> bool:
        """A non-finite producer failed (or GradScaler's scale collapsed): the run's status is ``nonfinite``."""
        return bool(self.judge.events) or self.scale_collapse is not None

    def interrupt(self) -> None:
        """Another rank failed: end the traced code at its next landmark (from the distributed watcher's thread).
        Not at its next op: what it runs up to there is what says how the failure reached it (the update that
        reads the gradients a collective made non-finite), and an op is no place to judge a step."""
        self._winding_up = True

    def stop_if_failed(self) -> None:
        """At a landmark, once it has judged and settled its step: stop at a failure found, or when another rank's
        failure is winding this one up."""
        self._stop_at_failure()
        if self._winding_up and not self.stopped:
            self._winding_up = False
            self._wound_up = True
            self._stop()

    def _stop_at_failure(self) -> None:
        if self.judge.stopped and not self.stopped:
            self._stop()

    def _stop(self) -> None:
        self.stopped = True
        if self._native is not None:
            self._native.stale()
        if self.options.stop_run:
            raise StopTracing

    # -- the training loop (training.TrainingWatch calls these) ------------------------------------------------
    def step_ended(self) -> None:
        self._step += 1

    def scaler_updated(self, skipped: bool, before: float, after: float) -> None:
        """A ``GradScaler.update``: a skipped step is a note; too many in a row are a collapse."""
        if self.stopped:
            return
        with untraced():
            self.flush()
            if not skipped:
                self._skip_streak.clear()
                self.judge.settle(final=False)
            else:
                first = self.judge.skip_step()
                note = SkippedStep(self._step, before, after, first, rank=self.options.rank)
                self.skipped_steps.append(note)
                self._skip_streak.append(note)
                self.training.step_ended()
                if len(self._skip_streak) >= self.options.max_skipped_steps:
                    self._collapsed(first)
        self.stop_if_failed()

    def _collapsed(self, first: Event | None) -> None:
        self.scale_collapse = ScaleCollapse.of_streak(
            self._skip_streak, limit=self.options.max_skipped_steps, rank=self.options.rank
        )
        if first is not None:
            self.judge.fail(self.judge.producer_index(first), "scale_collapse")
        else:
            self.stopped = self.options.stop_run or self.stopped
            if self._native is not None:
                self._native.stale()
            if self.options.stop_run and not self.options.keep_going:
                raise StopTracing

    # -- the result --------------------------------------------------------------------------------------------
    def notes(self) -> tuple[str, ...]:
        if not self.compile_calls:
            return ()
        return (
            f"torch.compile was called {self.compile_calls} time(s) and ran eagerly under tracing, so that every op "
            "could be checked; compiled kernels may round differently",
        )

    def report(
        self,
        *,
        steps: int | None = None,
        failure: BaseException | None = None,
        failure_traceback: str = "",
        **extra: Any,
    ) -> NanTraceReport:
        """The result; ``failure`` is the exception that ended the traced code, explained when it is a dtype
        mismatch that tracing saw happen."""
        events = tuple(sorted(self.judge.events, key=lambda e: e.op_index))
        events = merge_workers(events, self.workers.collected(), untraced=self.judge.untraced_inputs)
        dominant = self.flow.dominant
        dtype_error = None
        if failure is not None:
            dtype_error = explain(
                failure, self.flow.raised, dtype_name(dominant) if dominant is not None else None, failure_traceback
            )
        self.flow.raised.clear()  # they hold the exceptions, their frames and the tensors in them
        promotion = self.flow.promotion
        nonfinite = bool(events) or self.scale_collapse is not None
        report = NanTraceReport(
            status="nonfinite" if nonfinite else ("error" if dtype_error is not None else "clean"),
            first=events[0] if events else None,
            warnings=tuple(self.judge.warnings),
            ops=self.ops,
            steps=self.training.steps if steps is None else steps,
            events=events,
            stopped_early=nonfinite and not self.options.keep_going,
            notes=self.notes(),
            default_dtype=self.defaults.result(),
            promotions=(promotion,) if promotion is not None else (),
            dtype_error=dtype_error,
            handled=tuple(sorted(self.judge.handled, key=lambda e: e.op_index)),
            skipped_steps=tuple(self.skipped_steps),
            scale_collapse=self.scale_collapse,
            exception=self.raised if nonfinite else None,
        )
        return dataclasses.replace(report, **extra) if extra else report


class TracedWorkerInit:
    """A spawned or forkserver worker's ``worker_init_fn``: start a tracer there (it runs until the worker ends),
    handing what it finds to the traced process's folder; then the user's own ``worker_init_fn``, if any."""

    def __init__(self, user_init: Any, folder: Path, origin: int) -> None:
        self.user_init = user_init
        self.folder = folder
        self.origin = origin

    def __call__(self, worker_id: int) -> None:
        tracer = Tracer()
        tracer.workers = WorkerWatch(tracer, folder=self.folder, origin=self.origin)
        tracer.__enter__()  # left on: the worker process ends with os._exit, the tracer with it
        if self.user_init is not None:
            self.user_init(worker_id)


def _with_version(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the plain tensor, its version counter now): ``records.plain`` and ``records.version_of``, inlined."""
    local = getattr(tensor, "_local_tensor", None)
    if local is not None:
        tensor = local
    try:
        return tensor, tensor._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return tensor, version_of(tensor)


def _ended_normally(exc: BaseException | None) -> bool:
    """No exception, tracing's own stop, or ``sys.exit(0)``: not the traced code dying."""
    if exc is None or isinstance(exc, StopTracing | KeyboardInterrupt | GeneratorExit):
        return True
    return isinstance(exc, SystemExit) and exc.code in (None, 0)


def raised_exception(exc: BaseException, frames: FrameFinder) -> RaisedException:
    """What the traced code raised, at the innermost line of the user's own code in its traceback."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(exc, SystemExit):
        message = f"sys.exit({exc.code!r})"
    else:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    key: FrameKey | None = None
    tb = exc.__traceback__
    while tb is not None:
        if not frames.is_internal(tb.tb_frame.f_code):
            key = (tb.tb_frame.f_code, tb.tb_lineno)
        tb = tb.tb_next
    return RaisedException(type=name, message=message, location=location_of(key))


_NO_SHARE = (0, 0, 0)
_KIND_CODES = {OpKind.CHECK: 0, OpKind.PASS: 1, OpKind.UNINITIALISED: 2, OpKind.SCALAR: 3}
"""``OpKind`` as ``native/dispatch.cpp`` numbers it."""


def _tiny(name: str) -> float:
    from dtypecheck.dtypes import lookup

    return lookup(name).fmt.smallest_normal


__all__ = ["StopTracing", "TraceOptions", "TracedWorkerInit", "Tracer"]
