"""The ``dtypecheck.scan/1`` report: frozen dataclasses whose fields are the JSON keys (docs/json.md)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

from dtypecheck.display import ShowsAsHtml
from dtypecheck.findings import CAST_CHECKS, CHECK_LEVEL, Check, Finding, Level, rank, worst
from dtypecheck.scan.consistency import census
from dtypecheck.scan.roles import ROLE_RULES, Role, RoleRule

Number = float | int

State = Literal["new", "worse", "unchanged", "improved", "fixed"]
STATES: tuple[State, ...] = ("new", "worse", "unchanged", "improved", "fixed")
GATED_STATES: tuple[State, ...] = ("new", "worse")
"""With a baseline, only these gate the exit code and are annotated (SARIF, GitHub)."""


@dataclass(frozen=True)
class CastCounts:
    """What casting a tensor's values to one target does to them (docs/contract.md rounding rules)."""

    overflow: int | None
    """Finite values whose rounded magnitude exceeds the target's max (for an integer target: outside its range
    after truncation toward zero). Null for an empty tensor."""
    underflow: int | None
    """Nonzero finite values that round to zero (always 0 for integer targets)."""
    subnormal: int | None
    """Values that round to a nonzero subnormal of the target (always 0 for integer targets)."""
    level: Level
    fraction: Mapping[str, float] | None = field(default=None, kw_only=True)
    """Extra: each check's count as a fraction of the tensor's values (``{"overflow": 0.0, "underflow": 2e-06}``),
    so a handful of subnormals reads as what it is. Null for an empty tensor."""
    double_rounding: int | None = field(default=None, kw_only=True)
    """Extra: values whose cast by torch (float64 sources reach 16- and 8-bit floats through float32, rounding
    twice) differs from docs/contract.md's single rounding; the counts above are what torch gives. 0 when the cast is a
    single rounding; null for integer targets and empty tensors."""
    sqnr_db: float | None = field(default=None, kw_only=True)
    """Extra (``--precision``): signal-to-quantisation-noise ratio of the cast in dB,
    ``10 log10(sum x^2 / sum (x - cast(x))^2)`` over the finite values that stay finite (float8/float4 targets:
    after per-tensor scaling to the target's max); ``"inf"`` when the cast is exact, null when not measured or all
    values are zero."""
    max_rel_error: float | None = field(default=None, kw_only=True)
    """Extra (``--precision``): the largest ``|x - cast(x)| / |x|`` over the same values (1.0 once one flushes)."""


@dataclass(frozen=True)
class Float8CastCounts(CastCounts):
    scaled_underflow: int | None = None
    """Nonzero finite values that still round to zero after scaling the tensor by ``target.max / absmax``
    (absmax over the finite values), as fp8 training and inference do."""
    per_channel: SchemeVerdict | None = field(default=None, kw_only=True)
    """Extra (``--precision``): scaled per output channel (each row along dim 0 to the target's max); null for
    tensors with fewer than two dimensions, complex tensors, or when not measured."""
    mx: SchemeVerdict | None = field(default=None, kw_only=True)
    """Extra (``--precision``): block-scaled as OCP MX: 32-value blocks along the last dimension, each scaled by
    a power of two (an e8m0 scale, ``2**(floor(log2 amax) - emax)``), values beyond max clipped."""


@dataclass(frozen=True)
class SchemeVerdict:
    """What one scaling scheme (per channel, MX blocks) does to a tensor's finite values on a float8/float4 cast."""

    underflow: int
    """Nonzero values that round to zero after their group's scaling."""
    overflow: int
    """Values beyond the target's max after scaling, clipped to it (only MX's power-of-two scales overflow)."""
    sqnr_db: float | None
    """As ``CastCounts.sqnr_db``, in this scheme (``"inf"``: exact; null: all values zero)."""
    max_rel_error: float | None
    """As ``CastCounts.max_rel_error``, in this scheme (null: all values zero)."""


@dataclass(frozen=True)
class Log2Histogram:
    """How many values lie in each binade: ``counts[i]`` values have ``floor(log2|x|) == start + i``.

    Counted over every ``sampled_every``-th value (1 for tensors up to 2**20 values, 16 above: the exact
    counts elsewhere in the report do not depend on it). Zeros, inf, NaN and values below float32's
    (float64's) smallest normal are not in any bin."""

    start: int
    counts: tuple[int, ...]
    sampled_every: int = 1


@dataclass(frozen=True)
class TensorScan:
    """One tensor's statistics. Float statistics are over its values (for complex tensors: the real and
    imaginary parts, so counts go up to twice ``numel``); all statistics are null for an empty tensor."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    numel: int
    bytes: int
    min: Number | None
    """Smallest value, NaN ignored (-inf if present)."""
    max: Number | None
    absmax: Number | None
    min_abs_nonzero: Number | None
    nan: int | None
    posinf: int | None
    neginf: int | None
    zeros: int | None
    subnormal: int | None
    """Subnormal values in the tensor's own dtype."""
    casts: Mapping[str, CastCounts]
    level: Level
    log2_histogram: Log2Histogram | None = None
    """Extra: the magnitude distribution the table's sparkline and ``--plot`` draw (null for integer tensors)."""
    note: str | None = None
    """Extra: why a tensor was not scanned (a dtype dtypecheck cannot read the values of)."""
    policy: tuple[str, ...] = ()
    """Extra: checks the project's policy ignored or tolerated for this tensor, with the reason."""
    passed: tuple[str, ...] = ()
    """Extra: the keys (``check_key``) of the checks in ``policy``: they are neither gated nor annotated."""
    role: Role = "model"
    """Extra: what the tensor is in a training checkpoint (``dtypecheck.scan.roles``): ``model`` (parameters and
    buffers), ``optimizer`` (moments, master partitions) or ``bookkeeping`` (step counters, RNG, scaler...)."""
    not_judged: str | None = None
    """Extra: why its casts are not judged against the targets (its role keeps it in its own dtype by design: the
    counts are reported, their checks are in ``passed``); null when they are judged."""
    stored: str | None = None
    """Extra: how the file stores it when not as ``dtype`` (a GGUF quantization type such as ``Q4_K``: the
    statistics are of the values dequantized to ``dtype``); null when stored as ``dtype``."""
    stored_bytes: int | None = None
    """Extra: the bytes the file holds for it when ``stored`` is set (``bytes`` is its size in ``dtype``)."""
    alias_of: str | None = None
    """Extra: the tensor listed earlier whose data this name views (a tied weight, an LSTM's ``_flat_weights.N``):
    same statistics, read once and counted once in every total; null for a tensor of its own."""
    role_rule: RoleRule | None = field(default=None, repr=False, compare=False)
    """The role rule that gave it ``role`` and ``not_judged`` (``roles.ROLE_RULES``), whose other terms the policy
    applies (``RoleRule.infinite_sentinel``); None for the model's tensors. Not part of the report's document."""


@dataclass(frozen=True)
class CensusEntry:
    tensors: int
    numel: int
    bytes: int


@dataclass(frozen=True)
class KeepFloat32:
    """A float32/float64 tensor that no requested 16-bit or narrower target holds well (``keep_float32``)."""

    tensor: str
    reason: str
    """Why, per target: ``"float16: 3 values overflow; bfloat16: SQNR 18.2 dB < 20 dB"``."""


@dataclass(frozen=True)
class Verdict:
    """The answer for one target, from the exact counts of the tensors whose casts are judged
    (``dtypecheck.scan.verdicts``)."""

    target: str
    level: Level
    """The worst level of those tensors for this target (their own NaN/inf included)."""
    overflow: int
    """Values that overflow, summed over those tensors."""
    underflow: int
    """Nonzero values that flush to zero."""
    subnormal: int
    """Values that become subnormal."""
    fraction_flushed: float
    """``underflow`` as a fraction of every value of those tensors (both parts of complex ones)."""
    tensors: Mapping[str, int]
    """Those tensors by their level for this target: ``{"ok", "warn", "fail"}``."""
    worst: str | None
    """The tensor worst off in this target: of those at ``level``, the first in the table's order; null at ok."""
    advice: str
    """One line: "safe to cast", "cast, keep these 3 tensor(s) in float32: ...", "needs per-tensor scaling"..."""
    scaled_underflow: int | None = None
    """float8/fp4 targets: values that flush even after per-tensor scaling; null for other targets."""


@dataclass(frozen=True)
class NotJudged:
    """Tensors of one role rule whose casts are reported but not judged against the targets."""

    rule: str
    """The rule's name in ``dtypecheck.scan.roles.ROLE_RULES`` (``optimizer step counter``)."""
    reason: str
    tensors: tuple[str, ...]


@dataclass(frozen=True)
class ScanSummary:
    tensors: int
    numel: int
    bytes: int
    ok: int
    warn: int
    fail: int
    level: Level
    verdicts: tuple[Verdict, ...] = ()
    """Extra: one verdict per target, in the order of ``targets`` (``dtypecheck.scan.verdicts``)."""
    census: Mapping[str, CensusEntry] = field(default_factory=dict)
    """Extra: tensors, elements and bytes per dtype as stored (a GGUF quantization type such as ``Q4_K`` with the
    bytes the file holds, not the dequantized float32), the largest share of bytes first."""
    keep_float32: tuple[KeepFloat32, ...] = ()
    """Extra: float32/float64 tensors that fail or lose too much in every requested target narrower than 32 bits
    (see ``dtypecheck.scan.keep_float32``), the worst first; empty when no such target was requested."""
    not_judged: tuple[NotJudged, ...] = ()
    """Extra: the tensors whose casts are not judged against the targets, by role rule (``TensorScan.not_judged``)."""
    left_out: int = 0
    """Extra: tensors of the checkpoint not scanned, left out by ``include``/``exclude``/``weights_only``."""
    aliases: int = 0
    """Extra: names that view another listed tensor's data (``TensorScan.alias_of``); every total counts that data
    once, so ``tensors`` counts distinct tensors and the rows are ``tensors + aliases``."""


@dataclass(frozen=True)
class Change:
    """One check on one tensor (or one non-numeric finding) compared with the baseline."""

    tensor: str | None
    check: str
    """``nonfinite``, ``overflow:float16`` (``check_key``), or ``finding:<kind>:<detail>``."""
    before: int
    after: int
    state: State
    level: Level
    """The level this check carries now (for ``fixed``: the level it had)."""


@dataclass(frozen=True)
class BaselineComparison:
    source: str
    changes: tuple[Change, ...]
    counts: Mapping[str, int]
    """How many changes are in each state."""
    level: Level
    """The gate: the worst level among new and worse checks."""


@dataclass(frozen=True)
class ScanReport(ShowsAsHtml):
    SCHEMA: ClassVar[str] = "dtypecheck.scan/1"

    source: str
    format: str
    targets: tuple[str, ...]
    tensors: tuple[TensorScan, ...]
    findings: tuple[Finding, ...]
    summary: ScanSummary
    baseline: BaselineComparison | None = None
    """Extra (``--baseline``): each check compared with an earlier report; the exit code follows its level."""

    @property
    def gate_level(self) -> Level:
        """What the exit code follows: the report's level, or only what is new or worse than the baseline."""
        if self.baseline is None:
            return self.summary.level
        return self.baseline.level


def summarise(tensors: tuple[TensorScan, ...], findings: tuple[Finding, ...], left_out: int = 0) -> ScanSummary:
    counts = {"ok": 0, "warn": 0, "fail": 0}
    every = tensors
    tensors = tuple(t for t in every if t.alias_of is None)  # every total counts shared data once
    for tensor in tensors:
        counts[tensor.level] += 1
    as_stored = [replace(t, dtype=t.stored, bytes=t.stored_bytes or 0) if t.stored else t for t in tensors]
    dtypes = {row.dtype: CensusEntry(row.tensors, row.numel, row.bytes) for row in census(as_stored)}
    finding_levels: list[Level] = [f.level for f in findings]
    unjudged: dict[str, list[TensorScan]] = {}
    for tensor in every:
        if tensor.not_judged is not None:
            unjudged.setdefault(tensor.not_judged, []).append(tensor)
    return ScanSummary(
        tensors=len(tensors),
        numel=sum(t.numel for t in tensors),
        bytes=sum(t.bytes for t in tensors),
        ok=counts["ok"],
        warn=counts["warn"],
        fail=counts["fail"],
        level=worst([*(t.level for t in tensors), *finding_levels]),
        census=dtypes,
        not_judged=tuple(_not_judged(reason, group) for reason, group in unjudged.items()),
        left_out=left_out,
        aliases=len(every) - len(tensors),
    )


def _not_judged(reason: str, tensors: list[TensorScan]) -> NotJudged:
    rule = next((r.name for r in ROLE_RULES if r.not_judged == reason), tensors[0].role)
    return NotJudged(rule, reason, tuple(t.name for t in tensors))


def cast_counts(cast: CastCounts) -> dict[Check, int | None]:
    """The counts of every check a cast carries (``scaled_underflow`` only for float8/fp4 targets)."""
    counts: dict[Check, int | None] = {"overflow": cast.overflow, "underflow": cast.underflow}
    counts["subnormal"] = cast.subnormal
    if isinstance(cast, Float8CastCounts):
        counts["scaled_underflow"] = cast.scaled_underflow
    return {check: counts[check] for check in CAST_CHECKS if check in counts}


def fractions(counts: Mapping[str, int], values: int) -> dict[str, float]:
    """Each check's count as a fraction of a tensor's ``values`` (every value read, complex parts included)."""
    return {check: count / values for check, count in counts.items()} if values else {}


def without_scaled(counts: Mapping[str, int]) -> dict[str, int]:
    """``counts`` without ``scaled_underflow`` (a check only float8/float4 targets carry)."""
    return {check: count for check, count in counts.items() if check != "scaled_underflow"}


def nonfinite(tensor: TensorScan) -> int:
    """NaN and infinite values the tensor already holds."""
    return (tensor.nan or 0) + (tensor.posinf or 0) + (tensor.neginf or 0)


def tensor_checks(tensor: TensorScan) -> Iterator[tuple[str | None, Check, int]]:
    """``(target, check, count)`` for every nonzero check of a tensor (target None for its own values)."""
    if nonfinite(tensor):
        yield None, "nonfinite", nonfinite(tensor)
    for target, cast in tensor.casts.items():
        for check, count in cast_counts(cast).items():
            if count:
                yield target, check, count


def check_key(target: str | None, check: Check) -> str:
    """How a report names one check of a tensor: ``nonfinite`` or ``<check>:<target>`` (``underflow:float16``)."""
    return check if target is None else f"{check}:{target}"


def gated_checks(tensor: TensorScan) -> Iterator[tuple[str, Check, str | None, int]]:
    """``(key, check, target, count)`` for every nonzero check the policy did not pass: what gates and is annotated.

    A cast at level ``ok`` gates nothing (how reports written before ``passed`` existed say it)."""
    for target, check, count in tensor_checks(tensor):
        key = check_key(target, check)
        if key in tensor.passed or (target is not None and tensor.casts[target].level == "ok"):
            continue
        yield key, check, target, count


def finding_key(finding: Finding) -> str:
    """How a baseline names a non-numeric finding."""
    return f"finding:{finding.kind}:{finding.detail}"


def _values(tensor: TensorScan) -> int:
    """The number of values a tensor's fractions are of (read back from a cast's ``fraction`` where it has one:
    complex tensors count both parts)."""
    for cast in tensor.casts.values():
        counts = {str(check): count for check, count in cast_counts(cast).items()}
        for check, fraction in (cast.fraction or {}).items():
            count = counts.get(check)
            if count and fraction:
                return max(1, round(count / fraction))
    return max(1, tensor.numel)


def severity(tensor: TensorScan) -> tuple[int, int, float, float, int, int, str]:
    """Sort key, worst first.

    1. the tensor's level;
    2. its level on its own values and on its *plain* targets (float16, bfloat16, integers): a tensor that fails
       float16 outranks one that fails only a float8/float4 target, which scaling often rescues;
    3. how large a fraction of its values is at that level, on its own values and plain targets (the worst
       target), then on scaled targets: 30% of values flushed outranks a handful of subnormals;
    4. then the counts (values that fail, then values that warn), and the name.

    Checks the project's policy passed do not count.
    """
    values = _values(tensor)
    primary: list[Level] = []
    primary_share: dict[Level, float] = {}
    scaled_share: dict[Level, float] = {}
    failing = warning = 0
    per_target: dict[tuple[str | None, Level], int] = {}
    for _, check, target, count in gated_checks(tensor):
        level = CHECK_LEVEL[check] if target is None else tensor.casts[target].level
        if CHECK_LEVEL[check] == "fail":
            failing += count
        else:
            warning += count
        if CHECK_LEVEL[check] == level:
            per_target[(target, level)] = per_target.get((target, level), 0) + count
        if target is None or not isinstance(tensor.casts[target], Float8CastCounts):
            primary.append(level)
    for (target, level), count in per_target.items():
        scaled = target is not None and isinstance(tensor.casts[target], Float8CastCounts)
        shares = scaled_share if scaled else primary_share
        shares[level] = max(shares.get(level, 0.0), count / values)
    first = worst(primary)
    return (
        -rank(tensor.level),
        -rank(first),
        -primary_share.get(first, 0.0),
        -scaled_share.get(tensor.level, 0.0),
        -failing,
        -warning,
        tensor.name,
    )
