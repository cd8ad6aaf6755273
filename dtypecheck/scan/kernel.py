"""The fused single pass over a chunk of float32 or float64 values, on their bit patterns.

Every count ``scan-model`` reports is a comparison of a value's magnitude against a fixed threshold, and for
IEEE binary formats the magnitude's bit pattern (sign bit cleared) orders exactly as the magnitude does. So the
kernel works on the integer view of a chunk, block by block (a block stays in L1):

1. one vectorised loop computes the block's smallest and largest sign-folded key (ordered like the values,
   NaN beyond the infinities) and its smallest magnitude (as fast as ``torch.aminmax``: ~0.7 ns per value on
   one core here); only a block that holds zeros takes a second loop to count them and find its smallest
   nonzero magnitude;
2. for each threshold ``t`` (sorted), ``#(|x| >= t)`` is known without looking again when ``t`` is at or
   below the block's smallest nonzero magnitude (every nonzero value) or above its largest (none); only a
   threshold that falls inside the block's range costs a second, vectorised, loop over the L1-resident
   block. Weights span a dozen binades, so most targets' thresholds cost nothing;
3. a binade histogram of every ``stride``-th value, for the sparkline and ``--plot`` (a scatter does not
   vectorise, so it is sampled; every count above stays exact).

One boolean-mask pass per statistic costs ~100x more; this reads each value once from memory, and releases the
GIL so chunks run on every core. numba compiles it once and caches the machine code in the user's cache folder
(``numba_cache``, never in the package's own folder); without
numba (or with ``DTYPECHECK_NO_NUMBA=1``) numpy versions with identical results run instead.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

BLOCK = 4096
"""Elements per inner block: small enough for L1, large enough that the vectorised extrema loop amortises."""

F = TypeVar("F", bound=Callable[..., Any])


def _numba_wanted() -> bool:
    if os.environ.get("DTYPECHECK_NO_NUMBA", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("numba") is not None  # (found, not imported: that costs ~0.3 s, see jit)


NUMBA = _numba_wanted()


class _Lazy:
    """A function to compile with numba once compiled kernels are first asked for (``compile_all``).

    Importing numba and dispatching its first function costs ~0.3 s, more than a small checkpoint's whole scan
    with the numpy kernels, so nothing imports numba until a scan wants the compiled kernels."""

    def __init__(self, func: Callable[..., Any], options: dict[str, Any]) -> None:
        self.func = func
        self.options = options
        self.compiled: Callable[..., Any] | None = None
        functools.update_wrapper(self, func)
        _PENDING.append(self)

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None and not compile_all():
            return self.func(*args)  # (numba is there but cannot be imported: the plain function, slowly)
        assert self.compiled is not None
        return self.compiled(*args)


_PENDING: list[_Lazy] = []
_COMPILING = threading.Lock()


def compile_all() -> bool:
    """Import numba and make every ``jit`` function a numba dispatcher, in place: each module global naming a
    ``_Lazy`` (its own, or one imported from another module) is replaced by the dispatcher, so that compiled
    functions calling each other see dispatchers, as numba needs. Idempotent and thread-safe; False when numba,
    though installed, cannot be imported."""
    with _COMPILING:
        if not _PENDING:
            return True
        try:
            from numba import njit
        except ImportError:
            return False

        from dtypecheck.scan.numba_cache import compile_cached

        for lazy in _PENDING:
            lazy.compiled = compile_cached(njit, lazy.func, lazy.options)
        for lazy in _PENDING:
            names = lazy.func.__globals__
            for name, value in list(names.items()):
                if isinstance(value, _Lazy) and value.compiled is not None:
                    names[name] = value.compiled
        _PENDING.clear()
        return True


_OPTIONS: dict[str, Any] = {"nogil": True, "cache": True, "boundscheck": False, "error_model": "numpy"}


def jit(func: F) -> F:
    """Compile with numba (GIL released, machine code cached on disk) when it is there, on first use (``_Lazy``);
    else leave as is."""
    if not NUMBA:
        return func
    return cast(F, _Lazy(func, _OPTIONS))


def jit_sums(func: F) -> F:
    """``jit``, with the float additions of ``func`` itself allowed to be reassociated (LLVM's ``reassoc`` flag
    only: no assumption about NaN, inf or signed zeros), so that a loop summing floats vectorises.

    The flag applies to the instructions compiled for ``func``, not to those of the jitted functions it calls
    (they keep strict IEEE semantics when inlined), so exact arithmetic such as rounding belongs in a callee.
    """
    if not NUMBA:
        return func
    return cast(F, _Lazy(func, {**_OPTIONS, "fastmath": {"reassoc"}}))


@jit
def _block_extremes(block: np.ndarray, mask: Any, sign_shift: Any) -> tuple[Any, Any, Any]:
    """(min key, max key, min magnitude) of one block: the vectorised loop every value goes through once.

    numba widens int32 arithmetic to int64, which halves the vector width, so every intermediate is cast back
    to the type of the data (``T``). Small separate functions like this one vectorise where the same loop inside
    the big kernel did not (measured: 1.6 -> 0.7 ns per value).
    """
    T = block.dtype.type  # noqa: N806 - a type, named like one
    kmin = mask
    kmax = T(~mask)
    amin = mask
    for i in range(block.shape[0]):
        b = block[i]
        key = T(b ^ T(T(b >> sign_shift) & mask))
        kmin = min(kmin, key)
        kmax = max(kmax, key)
        amin = min(amin, T(b & mask))
    return kmin, kmax, amin


@jit
def _count_below(block: np.ndarray, mask: Any, sign_shift: Any, threshold: Any) -> int:
    """``#(|x| < threshold)``: ``(a - t) >> sign_shift`` is -1 exactly when ``a < t`` (both non-negative)."""
    T = block.dtype.type  # noqa: N806
    minus = T(0)
    for i in range(block.shape[0]):
        minus = T(minus + T(T(T(block[i] & mask) - threshold) >> sign_shift))
    return -int(minus)


@jit
def _zeros_and_smallest(block: np.ndarray, mask: Any, sign_shift: Any) -> tuple[int, Any]:
    """(zero count, smallest nonzero magnitude or ``mask + 1`` wrapped when all are zero) of a block with zeros."""
    T = block.dtype.type  # noqa: N806
    one = T(1)
    minus_zeros = T(0)
    smallest = mask
    for i in range(block.shape[0]):
        below = T(T(block[i] & mask) - one)  # zero becomes -1: counted, and masked to the largest pattern
        minus_zeros = T(minus_zeros + T(below >> sign_shift))
        smallest = min(smallest, T(below & mask))
    return -int(minus_zeros), T(smallest + one)


@jit
def _scan_bits_py(
    bits: np.ndarray,
    mask: Any,
    sign_shift: Any,
    shift: Any,
    posinf: Any,
    thresholds: np.ndarray,
    counts: np.ndarray,
    hist: np.ndarray,
    stride: int,
    extrema: np.ndarray,
) -> None:
    """Accumulate one chunk: ``counts[k] += #(|x| >= thresholds[k])`` (thresholds sorted ascending) and
    ``counts[-1] += #(x == +inf)``; ``hist[binade] += 1`` for every ``stride``-th value; ``extrema`` =
    ``[min key, max key, smallest nonzero magnitude]``, all in the integer type of ``bits``."""
    n = bits.shape[0]
    T = bits.dtype.type  # noqa: N806
    nthresholds = thresholds.shape[0]
    zero = T(0)
    one = T(1)
    kmin = extrema[0]
    kmax = extrema[1]
    amin = extrema[2]
    for start in range(0, n, BLOCK):
        stop = min(n, start + BLOCK)
        block = bits[start:stop]
        size = stop - start
        block_kmin, block_kmax, block_amin = _block_extremes(block, mask, sign_shift)
        nonzero = size
        if block_amin == zero:  # the block holds zeros: count them, and find its smallest nonzero magnitude
            zeros, block_amin = _zeros_and_smallest(block, mask, sign_shift)
            nonzero = size - zeros
        kmin = min(kmin, block_kmin)
        kmax = max(kmax, block_kmax)
        if block_amin > zero:  # (it wrapped below zero when every value is zero)
            amin = min(amin, block_amin)
        # The largest magnitude is that of one of the extreme keys (a negative key folds back to its magnitude).
        magnitude_low = block_kmin if block_kmin >= zero else T(T(block_kmin ^ mask) & mask)
        magnitude_high = block_kmax if block_kmax >= zero else T(T(block_kmax ^ mask) & mask)
        block_amax = max(magnitude_low, magnitude_high)
        for k in range(nthresholds):
            t = thresholds[k]
            if t > block_amax:
                break
            if t == one or t <= block_amin:
                counts[k] += nonzero
            else:
                counts[k] += size - _count_below(block, mask, sign_shift, t)
        if block_amax >= posinf:
            found = 0
            for i in range(start, stop):
                if bits[i] == posinf:
                    found += 1
            counts[nthresholds] += found
        for i in range(start, stop, stride):
            hist[T(bits[i] & mask) >> shift] += 1
    extrema[0] = kmin
    extrema[1] = kmax
    extrema[2] = amin


@jit
def _extrema_without_nan_py(bits: np.ndarray, mask: Any, sign_shift: Any, inf_bits: Any, extrema: np.ndarray) -> None:
    """``extrema[0:2]`` = min and max key over the non-NaN values (the slow path for a chunk holding a NaN)."""
    kmin = extrema[0]
    kmax = extrema[1]
    for i in range(bits.shape[0]):
        b = bits[i]
        if (b & mask) <= inf_bits:
            key = b ^ ((b >> sign_shift) & mask)
            kmin = min(kmin, key)
            kmax = max(kmax, key)
    extrema[0] = kmin
    extrema[1] = kmax


@jit
def _count_magnitudes_py(bits: np.ndarray, mask: Any, low: Any, high: Any) -> int:
    """``#(low <= |x| < high)`` on magnitude bit patterns."""
    count = 0
    for i in range(bits.shape[0]):
        a = bits[i] & mask
        count += (a >= low) & (a < high)
    return count


@jit
def _max_finite_magnitude_py(bits: np.ndarray, mask: Any, inf_bits: Any) -> Any:
    """Largest finite magnitude pattern (0 when there is none)."""
    best = mask - mask
    for i in range(bits.shape[0]):
        a = bits[i] & mask
        if a < inf_bits:
            best = max(best, a)
    return best


# --- numpy versions: same contracts, used without numba and to cross-check the compiled kernel in tests ------


def _scan_bits_np(
    bits: np.ndarray,
    mask: Any,
    sign_shift: Any,
    shift: Any,
    posinf: Any,
    thresholds: np.ndarray,
    counts: np.ndarray,
    hist: np.ndarray,
    stride: int,
    extrema: np.ndarray,
) -> None:
    if bits.size == 0:
        return
    magnitude = bits & mask
    for k, threshold in enumerate(thresholds):
        counts[k] += int(np.count_nonzero(magnitude >= threshold))
    counts[-1] += int(np.count_nonzero(bits == posinf))
    hist += np.bincount(magnitude[::stride] >> shift, minlength=hist.shape[0])
    key = bits ^ ((bits >> sign_shift) & mask)
    extrema[0] = min(extrema[0], key.min())
    extrema[1] = max(extrema[1], key.max())
    nonzero = magnitude[magnitude != 0]
    if nonzero.size:
        extrema[2] = min(extrema[2], nonzero.min())


def _extrema_without_nan_np(bits: np.ndarray, mask: Any, sign_shift: Any, inf_bits: Any, extrema: np.ndarray) -> None:
    kept = bits[(bits & mask) <= inf_bits]
    if kept.size:
        key = kept ^ ((kept >> sign_shift) & mask)
        extrema[0] = min(extrema[0], key.min())
        extrema[1] = max(extrema[1], key.max())


def _count_magnitudes_np(bits: np.ndarray, mask: Any, low: Any, high: Any) -> int:
    magnitude = bits & mask
    return int(np.count_nonzero((magnitude >= low) & (magnitude < high)))


def _max_finite_magnitude_np(bits: np.ndarray, mask: Any, inf_bits: Any) -> Any:
    magnitude = bits & mask
    finite = magnitude[magnitude < inf_bits]
    return finite.max() if finite.size else mask - mask


class Kernels:
    """The four kernels: numba-compiled where numba is installed, else the numpy versions."""

    def __init__(self, compiled: bool) -> None:
        self.compiled = compiled and compile_all()  # (on the main thread, before any worker calls a kernel)
        if self.compiled:
            self.scan_bits = _scan_bits_py
            self.extrema_without_nan = _extrema_without_nan_py
            self.count_magnitudes = _count_magnitudes_py
            self.max_finite_magnitude = _max_finite_magnitude_py
        else:
            self.scan_bits = _scan_bits_np
            self.extrema_without_nan = _extrema_without_nan_np
            self.count_magnitudes = _count_magnitudes_np
            self.max_finite_magnitude = _max_finite_magnitude_np


SMALL_SCAN_BYTES = 64 << 20
"""A scan of fewer bytes than this uses the numpy kernels by default: at ~4 ns of CPU per value (numba's ~1 ns
with the reads) they finish it (~60 ms) before numba would have been imported and dispatched (~0.3 s)."""
SMALL_PRECISION_SCAN_BYTES = 1 << 20
"""The same with ``--precision``, whose numpy version costs ~400 ns per value (float64 temporaries per target)."""


def kernels(compiled: bool | None = None, data_bytes: int | None = None, *, precision: bool = False) -> Kernels:
    """The compiled kernels when numba is in use (``compiled=None``) and the scan reads at least
    ``SMALL_SCAN_BYTES`` (``SMALL_PRECISION_SCAN_BYTES`` with ``precision``; ``data_bytes`` None: unknown, so
    compiled), or the version asked for."""
    if compiled is None:
        small = SMALL_PRECISION_SCAN_BYTES if precision else SMALL_SCAN_BYTES
        compiled = data_bytes is None or data_bytes >= small
    return Kernels(compiled and NUMBA)
