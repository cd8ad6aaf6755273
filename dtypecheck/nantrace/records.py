"""What the cheap pass keeps per op: references and on-device reductions, no host sync."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from dtypecheck.nantrace.frames import FrameKey
from dtypecheck.nantrace.ops import OpInfo

if TYPE_CHECKING:
    import torch

CHECKED_DTYPES_NAMES = ("float16", "bfloat16", "float32", "float64")
HALF_NAMES = ("float16", "bfloat16")


def plain(tensor: torch.Tensor) -> torch.Tensor:
    """The local tensor of a ``DTensor`` (FSDP2's sharded parameters, gradients and states); else ``tensor``.

    Checks and storage keys work on plain tensors: reductions on a DTensor return DTensors, and a wrapper subclass
    has no storage of its own.
    """
    local = getattr(tensor, "_local_tensor", None)
    return local if local is not None else tensor


_UNTRACKED = itertools.count(1)


def version_of(tensor: torch.Tensor) -> int:
    """``tensor._version``; for an inference tensor, which keeps no version counter (torch raises "Inference
    tensors do not track version counter"), a number never seen before, so that it never reads as unchanged."""
    try:
        return tensor._version
    except RuntimeError:
        return -next(_UNTRACKED)


def readable(tensor: torch.Tensor, *, storage_less: bool = False) -> bool:
    """Whether ``tensor``'s memory still holds all its elements: FSDP frees a parameter's unsharded storage after
    use (``resize_(0)``) without touching the tensor, and reading it then would crash the process. ``storage_less``:
    the answer for a tensor with no storage of its own (a subclass whose own ops read it, a jagged nested tensor's
    wrapper)."""
    if tensor.numel() == 0:
        return True
    try:
        stored = tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # no storage of its own
        return storage_less
    extent = (
        tensor.storage_offset() + 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    )
    return bool(stored >= extent * tensor.element_size())


class Checked:
    """One floating tensor examined by an on-device ``aminmax`` (NaN-propagating), read back at the next flush."""

    __slots__ = ("absmax", "has_inf", "has_nan", "hi", "lo", "small", "small_count", "tensor", "version")

    def __init__(
        self, tensor: torch.Tensor, lo: torch.Tensor | None, hi: torch.Tensor | None, small: torch.Tensor | None
    ) -> None:
        self.tensor = tensor
        self.version: int = version_of(tensor)
        self.lo: torch.Tensor | None = lo
        self.hi: torch.Tensor | None = hi
        """None once read (``settle``), or read at once (``read``)."""
        self.small: torch.Tensor | None = small
        """Half precision only: how many values are below the smallest normal (zeros included)."""
        self.absmax = 0.0
        self.has_nan = False
        self.has_inf = False
        self.small_count = 0

    @classmethod
    def read(cls, tensor: torch.Tensor, lo: float, hi: float, small: int) -> Checked:
        """A check whose extremes and small count were read on the host already (the C++ check of a CPU tensor)."""
        checked = cls(tensor, None, None, None)
        checked.settle(lo, hi)
        checked.small_count = small
        return checked

    def settle(self, lo: float, hi: float) -> None:
        """The flags and magnitude from the tensor's extremes (NaN in both where it holds one, as ``aminmax``)."""
        self.has_nan = math.isnan(lo) or math.isnan(hi)
        self.has_inf = lo == -math.inf or hi == math.inf
        # abs(): an all-zero tensor's extremes may be 0.0 or -0.0, depending on the kernel's order of reading.
        self.absmax = math.nan if self.has_nan else abs(max(-lo, hi))

    @property
    def nonfinite(self) -> bool:
        return self.has_nan or self.has_inf


class OpRecord:
    """One traced op: enough to decide, after the flush, whether it produced the first non-finite value."""

    __slots__ = (
        "args",
        "checked",
        "clones",
        "frame",
        "func",
        "grad_enabled",
        "grad_fn",
        "index",
        "info",
        "inputs",
        "kwargs",
        "module",
        "node",
        "phase",
        "pre",
        "result",
        "step",
        "tagged",
    )

    def __init__(
        self,
        index: int,
        func: Any,
        info: OpInfo,
        node: Any,
        module: str | None,
        frame: FrameKey | None,
        grad_enabled: bool,
        step: int,
    ) -> None:
        self.index = index
        self.func = func
        self.info = info
        self.node = node
        """The autograd node running this op (backward), else None."""
        self.module = module
        self.frame = frame
        self.grad_enabled = grad_enabled
        self.step = step
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.inputs: list[tuple[torch.Tensor, int]] = []
        """Floating tensors the op read, with their version counters at call time."""
        self.pre: list[Checked] = []
        """Arguments it read and then overwrote, examined before it ran."""
        self.clones: dict[int, torch.Tensor] = {}
        """Copies of those arguments as they were before the op, by ``id`` of the argument, for the re-run."""
        self.checked: list[Checked] = []
        self.result: torch.Tensor | None = None
        """The first tensor it returned, whose ``grad_fn`` maps backward ops back to this forward line."""
        self.phase = "other"
        self.grad_fn: str | None = None
        self.tagged = False
        """Its phase and node settled (``Judge.tag_forward_node``): at the next op, else at the flush."""

    def release(self) -> None:
        """Drop the references once the flush has judged the op (keeps what the history shows)."""
        self.args = ()
        self.kwargs = {}
        self.inputs = []
        self.clones = {}
        self.result = None
        self.node = None
        self.pre = []
        self.checked = []
