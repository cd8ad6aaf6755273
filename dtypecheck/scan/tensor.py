"""One tensor's statistics, accumulated chunk by chunk (chunks may be processed in any order, on any thread).

Floating tensors of every width are converted chunk-wise to float32 (float64 stays float64; both conversions
are exact) and their bit patterns go through the fused kernel (``kernel``); complex tensors are scanned
as their real and imaginary parts; float4 is decoded through a 16-entry table. Integer and bool tensors get
min/max and counts from numpy, and casts only to integer targets.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dtypecheck.dtypes import DtypeSpec, lookup
from dtypecheck.findings import Level, level_of_counts, worst
from dtypecheck.loaders.base import TensorRecord
from dtypecheck.scan.kernel import Kernels
from dtypecheck.scan.measures import Losses, MeasurePlan
from dtypecheck.scan.report import (
    CastCounts,
    Float8CastCounts,
    Log2Histogram,
    TensorScan,
    fractions,
    without_scaled,
)
from dtypecheck.scan.thresholds import FLOAT32, FLOAT64, KernelFormat, normal_threshold, scaled_survive_pattern
from dtypecheck.scan.values import ChunkResult, float4_table, float_to_int_overflow, float_values, integer_chunk
from dtypecheck.scan.via_float32 import double_rounding_count, goes_via_float32, torch_patterns

if TYPE_CHECKING:
    import torch

KERNEL_CHUNK_BYTES = 32 * 1024 * 1024
"""Bytes of converted values per chunk: bounds the private memory of each chunk in flight."""
EXACT_HISTOGRAM_VALUES = 1 << 20
"""Tensors up to this many values get an exact histogram; larger ones a sample (see ``kernel``)."""
HISTOGRAM_STRIDE = 16

INT_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
"""Integer dtypes numpy can hold (sub-byte and quantized ones are reported, not read)."""


@dataclass(frozen=True)
class Stats:
    """A tensor's own statistics (all null for an empty tensor)."""

    min: float | int | None = None
    max: float | int | None = None
    absmax: float | int | None = None
    min_abs_nonzero: float | int | None = None
    nan: int | None = None
    posinf: int | None = None
    neginf: int | None = None
    zeros: int | None = None
    subnormal: int | None = None


class TensorScanner:
    """Accumulates one record's chunks; ``result()`` builds its ``TensorScan``."""

    def __init__(
        self, record: TensorRecord, targets: Sequence[DtypeSpec], kernels: Kernels, *, precision: bool = False
    ) -> None:
        self.record = record
        self.targets = list(targets)
        self.kernels = kernels
        self.spec: DtypeSpec | None
        try:
            self.spec = lookup(record.dtype)
        except Exception:  # noqa: BLE001 - an unknown dtype name from a file is reported, not raised
            self.spec = None
        self.mode = self._mode()
        self._lock = threading.Lock()
        self.values = 0
        self.hist = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self.extrema = np.zeros(0, dtype=np.int64)
        self.int_overflow = [0] * len(self._int_targets())
        self.int_stats: list[int | None] = [None, None, 0, None]
        self.scaled_counts: dict[str, int] = {}
        self.double_rounding: dict[str, int] = {}
        self.via_float32: list[DtypeSpec] = []
        self.plan = (
            MeasurePlan(record.shape, self.values_per_element, targets, compiled=kernels.compiled)
            if precision
            else None
        )
        self.losses = Losses()
        self.finite_absmax: float | None = None
        if self.mode == "float":
            self._prepare_float()

    # --- planning -------------------------------------------------------------------------------------

    def _mode(self) -> str:
        spec = self.spec
        if spec is None or spec.quantized:
            return "unsupported"
        if spec.kind in ("float", "complex"):
            return "float"
        return "int" if spec.name in INT_DTYPES else "unsupported"

    def _float_targets(self) -> list[DtypeSpec]:
        return [t for t in self.targets if t.kind == "float"]

    def _int_targets(self) -> list[DtypeSpec]:
        if self.mode == "unsupported":
            return []
        return [t for t in self.targets if t.kind in ("int", "uint")]

    def _prepare_float(self) -> None:
        spec = self.spec
        assert spec is not None
        self.own = spec.fmt
        self.kernel: KernelFormat = FLOAT64 if self.own.bits == 64 else FLOAT32
        kernel = self.kernel
        self.own_normal_at = normal_threshold(self.own, kernel)
        self.patterns = {t.name: torch_patterns(t, kernel) for t in self._float_targets()}
        self.via_float32 = [t for t in self._float_targets() if goes_via_float32(t, kernel)]
        wanted = {1, self.own_normal_at, kernel.inf_bits, kernel.inf_bits + 1}
        for p in self.patterns.values():
            wanted |= {p.survive, p.normal, p.overflow}
        self.thresholds = np.array(sorted(wanted), dtype=kernel.int_dtype)
        self.index = {int(v): i for i, v in enumerate(self.thresholds)}
        values = self.record.numel * self.values_per_element
        self.stride = 1 if values <= EXACT_HISTOGRAM_VALUES else HISTOGRAM_STRIDE
        int_t = kernel.int_dtype
        self.mask = int_t(kernel.mask)
        self.sign_shift = int_t(kernel.bits - 1)
        self.shift = int_t(kernel.shift)
        self.posinf = int_t(kernel.inf_bits)
        self.inf_bits = int_t(kernel.inf_bits)
        key_limits = np.array([kernel.inf_bits, kernel.inf_bits | (1 << (kernel.bits - 1))], dtype=np.uint64)
        folded = key_limits.astype(int_t) if kernel.bits == 64 else key_limits.astype(np.uint32).view(np.int32)
        folded = folded ^ ((folded >> (kernel.bits - 1)) & self.mask)
        self.key_posinf, self.key_neginf = int(folded[0]), int(folded[1])
        self.float4_table = float4_table(self.own) if spec.packed > 1 else None
        self.hist = np.zeros(kernel.bins, dtype=np.int64)
        self.counts = np.zeros(len(self.thresholds) + 1, dtype=np.int64)
        info = np.iinfo(int_t)
        self.extrema = np.array([info.max, info.min, kernel.mask], dtype=int_t)

    @property
    def readable(self) -> bool:
        """Whether this tensor's values will be read (it has data, of a dtype dtypecheck can read)."""
        return self.record.source is not None and self.mode != "unsupported"

    @property
    def values_per_element(self) -> int:
        spec = self.spec
        if spec is None:
            return 1
        return 2 if spec.kind == "complex" else spec.packed

    def chunk_bytes(self) -> int:
        """Source bytes per chunk, so that the converted chunk stays near ``KERNEL_CHUNK_BYTES``; a whole number
        of the rows the precision measures need (``MeasurePlan.unit``), so that a contiguous source's chunks
        need no regrouping."""
        if self.mode != "float" or self.record.numel == 0:
            return KERNEL_CHUNK_BYTES
        source_itemsize = max(1, self.record.nbytes // max(1, self.record.numel))
        converted = self.values_per_element * (self.kernel.bits // 8)
        size = max(source_itemsize, KERNEL_CHUNK_BYTES * source_itemsize // max(converted, source_itemsize))
        row = (self.plan.unit or 0) * source_itemsize if self.plan is not None else 0
        return size - size % row if 0 < row <= size else size

    def rows_whole(self, nbytes: int) -> bool:
        """Whether a chunk of ``nbytes`` source bytes holds whole rows for the precision measures."""
        unit = None if self.plan is None else self.plan.unit
        if not unit or self.record.numel == 0:
            return True
        source_itemsize = max(1, self.record.nbytes // self.record.numel)
        return nbytes % (unit * source_itemsize) == 0

    # --- per chunk (any thread) ----------------------------------------------------------------------

    def _float_values(self, chunk: torch.Tensor | np.ndarray) -> np.ndarray:
        assert self.spec is not None
        return float_values(chunk, self.kernel, self.float4_table)

    def process(self, chunk: torch.Tensor | np.ndarray) -> ChunkResult:
        if self.mode == "float":
            return self._process_float(chunk)
        return self._process_int(chunk)

    def _process_float(self, chunk: torch.Tensor | np.ndarray) -> ChunkResult:
        kernel = self.kernel
        values = self._float_values(chunk)
        bits = values.view(kernel.int_dtype)
        hist = np.zeros(kernel.bins, dtype=np.int64)
        counts = np.zeros(len(self.thresholds) + 1, dtype=np.int64)
        info = np.iinfo(kernel.int_dtype)
        extrema = np.array([info.max, info.min, kernel.mask], dtype=kernel.int_dtype)
        k = self.kernels
        k.scan_bits(
            bits,
            self.mask,
            self.sign_shift,
            self.shift,
            self.posinf,
            self.thresholds,
            counts,
            hist,
            self.stride,
            extrema,
        )
        if int(extrema[1]) > self.key_posinf or int(extrema[0]) < self.key_neginf:
            # A NaN sorts beyond the infinities: redo the extrema without it (rare, so the slow way).
            extrema[0], extrema[1] = info.max, info.min
            k.extrema_without_nan(bits, self.mask, self.sign_shift, self.inf_bits, extrema)
        overflow = tuple(float_to_int_overflow(values, t) for t in self._int_targets())
        rounding = tuple(double_rounding_count(values, t.fmt) for t in self.via_float32)
        return ChunkResult(
            values=bits.size,
            hist=hist,
            counts=counts,
            extrema=extrema,
            int_overflow=overflow,
            double_rounding=rounding,
            losses=None if self.plan is None else self.plan.measure_unscaled(values),
        )

    def _process_int(self, chunk: torch.Tensor | np.ndarray) -> ChunkResult:
        return integer_chunk(chunk, self._int_targets())

    def merge(self, part: ChunkResult) -> None:
        with self._lock:
            self.values += part.values
            for i, count in enumerate(part.int_overflow):
                self.int_overflow[i] += count
            for target, count in zip(self.via_float32, part.double_rounding, strict=True):
                self.double_rounding[target.name] = self.double_rounding.get(target.name, 0) + count
            if part.losses is not None:
                self.losses.add(part.losses)
            if part.hist is not None:
                self.hist += part.hist
            if part.counts is not None:
                self.counts += part.counts
            if part.extrema is not None:
                self.extrema[0] = min(self.extrema[0], part.extrema[0])
                self.extrema[1] = max(self.extrema[1], part.extrema[1])
                self.extrema[2] = min(self.extrema[2], part.extrema[2])
            if part.int_stats is not None:
                low, high, zeros, smallest = part.int_stats
                current = self.int_stats
                current[0] = low if current[0] is None else min(current[0], low)
                current[1] = high if current[1] is None else max(current[1], high)
                current[2] = (current[2] or 0) + zeros
                if smallest is not None:
                    current[3] = smallest if current[3] is None else min(current[3], smallest)

    # --- the second pass: fp8 scaling (and --precision's measures) need the tensor's absmax first ----------

    def _count_at_least(self, pattern: int) -> int:
        """``#(|x| >= value of pattern)``, NaN patterns included (they sort above inf)."""
        return int(self.counts[self.index[pattern]])

    def needs_second_pass(self) -> bool:
        wanted = any(t.scaled for t in self._float_targets())  # plain casts are measured in the first pass
        if self.mode != "float" or self.values == 0 or not wanted:
            return False
        return self._count_at_least(self.kernel.inf_bits + 1) < self.values  # not all NaN

    def needs_finite_absmax(self) -> bool:
        inf = self._count_at_least(self.kernel.inf_bits) - self._count_at_least(self.kernel.inf_bits + 1)
        return inf > 0

    def second_chunks(self, chunks: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
        """The second pass's chunks: cut on whole rows when per-channel and MX scaling are measured."""
        return chunks if self.plan is None else self.plan.regroup(chunks)

    def second_pass(self, chunk: torch.Tensor | np.ndarray, absmax: float) -> tuple[dict[str, int], Losses | None]:
        values = self._float_values(chunk)
        bits = values.view(self.kernel.int_dtype)
        found = {}
        for target in self._float_targets():
            if target.scaled:
                survive = scaled_survive_pattern(target, self.kernel, absmax) if absmax > 0 else 1
                found[target.name] = int(
                    self.kernels.count_magnitudes(bits, self.mask, self.kernel.scalar(1), self.kernel.scalar(survive))
                )
        return found, None if self.plan is None else self.plan.measure(values, absmax)

    def finite_max_pass(self, chunk: torch.Tensor | np.ndarray) -> int:
        bits = self._float_values(chunk).view(self.kernel.int_dtype)
        return int(self.kernels.max_finite_magnitude(bits, self.mask, self.inf_bits))

    def merge_finite_max(self, magnitude: int) -> None:
        with self._lock:
            value = self.kernel.float_of_magnitude(magnitude)
            self.finite_absmax = value if self.finite_absmax is None else max(self.finite_absmax, value)

    def merge_second(self, part: tuple[dict[str, int], Losses | None]) -> None:
        counts, losses = part
        with self._lock:
            if losses is not None:
                self.losses.add(losses)
            for name, count in counts.items():
                self.scaled_counts[name] = self.scaled_counts.get(name, 0) + count

    # --- the result ---------------------------------------------------------------------------------------

    def result(self) -> TensorScan:
        if self.mode == "unsupported":
            return self._tensor(Stats(), {}, "ok", note=f"values of {self.record.dtype} are not read")
        if self.values == 0:
            casts = {t.name: _null_cast(t) for t in self._applicable_targets()}
            note = "no data (e.g. a meta-device tensor)" if self.record.numel else None
            return self._tensor(Stats(), casts, "ok", note=note)
        if self.mode == "int":
            return self._int_result()
        return self._float_result()

    def _tensor(
        self,
        stats: Stats,
        casts: dict[str, CastCounts],
        level: Level,
        histogram: Log2Histogram | None = None,
        note: str | None = None,
    ) -> TensorScan:
        record = self.record
        return TensorScan(
            name=record.name,
            dtype=record.dtype,
            shape=tuple(record.shape),
            numel=record.numel,
            bytes=record.nbytes,
            min=stats.min,
            max=stats.max,
            absmax=stats.absmax,
            min_abs_nonzero=stats.min_abs_nonzero,
            nan=stats.nan,
            posinf=stats.posinf,
            neginf=stats.neginf,
            zeros=stats.zeros,
            subnormal=stats.subnormal,
            casts=casts,
            level=level,
            log2_histogram=histogram,
            note=note,
            stored=record.stored,
            stored_bytes=record.stored_bytes,
        )

    def _applicable_targets(self) -> list[DtypeSpec]:
        return self._float_targets() + self._int_targets() if self.mode == "float" else self._int_targets()

    def _int_result(self) -> TensorScan:
        low, high, zeros, smallest = self.int_stats
        if low is None or high is None:
            raise AssertionError("integer statistics merged without values")
        casts: dict[str, CastCounts] = {}
        for target, count in zip(self._int_targets(), self.int_overflow, strict=True):
            casts[target.name] = CastCounts(
                count,
                0,
                0,
                level_of_counts({"overflow": count}),
                fraction=fractions({"overflow": count, "underflow": 0, "subnormal": 0}, self.values),
            )
        stats = Stats(low, high, max(abs(low), abs(high)), smallest, 0, 0, 0, zeros, 0)
        return self._tensor(stats, casts, worst([c.level for c in casts.values()]))

    def _float_result(self) -> TensorScan:
        kernel = self.kernel
        at = self._count_at_least
        nonzero = at(1)
        nan = at(kernel.inf_bits + 1)
        infinite = at(kernel.inf_bits) - nan
        posinf = int(self.counts[-1])
        low = high = absmax = None
        if nan < self.values:
            low = kernel.float_of_key(int(self.extrema[0]))
            high = kernel.float_of_key(int(self.extrema[1]))
            absmax = max(abs(low), abs(high))
        smallest_at = int(self.extrema[2])
        smallest = kernel.float_of_magnitude(smallest_at) if smallest_at <= kernel.inf_bits else None
        stats = Stats(
            low,
            high,
            absmax,
            smallest,
            nan,
            posinf,
            infinite - posinf,
            self.values - nonzero,
            nonzero - at(self.own_normal_at),
        )
        casts: dict[str, CastCounts] = {}
        for target in self._float_targets():
            p = self.patterns[target.name]
            overflow = at(p.overflow) - at(kernel.inf_bits)
            underflow = nonzero - at(p.survive)
            subnormal = at(p.survive) - at(p.normal)
            scaled = self.scaled_counts.get(target.name, 0)  # no pass ran: no finite value to lose
            counts = {"overflow": overflow, "underflow": underflow, "subnormal": subnormal, "scaled_underflow": scaled}
            level = level_of_counts(counts)
            extra = {
                "fraction": fractions(counts if target.scaled else without_scaled(counts), self.values),
                "double_rounding": self.double_rounding.get(target.name, 0),
                **MeasurePlan.cast_fields(self.losses, target),
            }
            if target.scaled:
                casts[target.name] = Float8CastCounts(overflow, underflow, subnormal, level, scaled, **extra)
            else:
                casts[target.name] = CastCounts(overflow, underflow, subnormal, level, **extra)
        for target, count in zip(self._int_targets(), self.int_overflow, strict=True):
            finite_overflow = count - infinite  # +inf passed the upper test and -inf the lower one
            casts[target.name] = CastCounts(
                finite_overflow,
                0,
                0,
                level_of_counts({"overflow": finite_overflow}),
                fraction=fractions({"overflow": finite_overflow, "underflow": 0, "subnormal": 0}, self.values),
            )
        own = level_of_counts({"nonfinite": nan + infinite})
        level = worst([own, *(c.level for c in casts.values())])
        return self._tensor(stats, casts, level, self._histogram())

    def _histogram(self) -> Log2Histogram | None:
        kernel = self.kernel
        # Bin 0 (zeros and the kernel format's own subnormals) and the top bin (inf, NaN) are not binades.
        counts = [int(c) for c in self.hist[1:-1]]
        nonzero = [i for i, c in enumerate(counts) if c]
        if not nonzero:
            return None
        first, last = nonzero[0], nonzero[-1]
        return Log2Histogram(kernel.binade_of_bin(first + 1), tuple(counts[first : last + 1]), self.stride)

    def scaling_absmax(self) -> float:
        """The finite absmax fp8 scaling divides by (after ``finite_max_pass`` when the tensor holds inf)."""
        if self.finite_absmax is not None:
            return self.finite_absmax
        low = self.kernel.float_of_key(int(self.extrema[0]))
        high = self.kernel.float_of_key(int(self.extrema[1]))
        return max(abs(low), abs(high))


def _null_cast(target: DtypeSpec) -> CastCounts:
    if target.scaled:
        return Float8CastCounts(None, None, None, "ok", None)
    return CastCounts(None, None, None, "ok")
