"""torch's type promotion for a set of dtypes, the rule that decided each result, and what the result loses.

The results come from torch itself (``torch.promote_types``, ``torch.result_type``); dtypecheck only explains
them and checks the promoted type against the inputs' ranges with the registry's exact limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from dtypecheck.dtypes import DtypeSpec, lookup, spec_of

_CATEGORY = {"bool": 0, "uint": 1, "int": 1, "float": 2, "complex": 3}
_CATEGORY_NAME = {0: "bool", 1: "integer", 2: "floating", 3: "complex"}


@dataclass(frozen=True)
class Promotion:
    """``a op b`` for two dimensioned tensors."""

    inputs: tuple[str, str]
    result: str | None
    """The promoted dtype, or null where torch refuses to promote."""
    rule: str
    losses: tuple[str, ...]
    """What an input's values can lose in the result: range (overflow to inf) or integer exactness."""
    error: str | None = None


@dataclass(frozen=True)
class ScalarPromotion:
    """A dimensioned tensor of ``dtype`` combined with a Python scalar or a zero-dim tensor."""

    dtype: str
    other: str
    """``python bool``, ``python int``, ``python float``, ``python complex``, ``0-dim float64 tensor``."""
    result: str | None
    rule: str


@dataclass(frozen=True)
class PromotionReport:
    inputs: tuple[str, ...]
    result: str | None
    """All inputs promoted together (null if any pair is refused)."""
    pairs: tuple[Promotion, ...]
    scalars: tuple[ScalarPromotion, ...]


@dataclass(frozen=True)
class Defaults:
    """The default dtype in effect and what plain constructors give under it."""

    default_dtype: str
    constructors: dict[str, str]


def _category(spec: DtypeSpec) -> int:
    return _CATEGORY[spec.kind]


def _value_range(spec: DtypeSpec) -> tuple[float, float]:
    if spec.int_range is not None:
        return float(spec.int_range[0]), float(spec.int_range[1])
    return spec.fmt.min, spec.fmt.max


def losses(source: DtypeSpec, result: DtypeSpec) -> tuple[str, ...]:
    """What values of ``source`` cannot survive in ``result``."""
    if source.name == result.name or result.kind == "bool":
        return ()
    found: list[str] = []
    low, high = _value_range(source)
    if result.is_floating_or_complex:
        limit = result.fmt.max
        if high > limit or -low > limit:
            found.append(f"{source.name} values beyond ±{limit:g} overflow to inf in {result.name}")
        exact = 2 ** (result.fmt.mantissa_bits + 1)
        if source.int_range is not None and source.kind != "bool" and high > exact:
            found.append(f"{source.name} integers above {exact:,} are rounded in {result.name}")
        elif source.is_floating_or_complex and source.fmt.mantissa_bits > result.fmt.mantissa_bits:
            found.append(f"{source.name} loses {source.fmt.mantissa_bits - result.fmt.mantissa_bits} mantissa bits")
    elif result.int_range is not None:
        r_low, r_high = result.int_range
        if high > r_high or low < r_low:
            found.append(f"{source.name} values outside [{r_low:,}, {r_high:,}] wrap around in {result.name}")
    return tuple(found)


def _rule(a: DtypeSpec, b: DtypeSpec, result: DtypeSpec) -> str:
    ca, cb = _category(a), _category(b)
    if ca != cb:
        higher = a if ca > cb else b
        lower = b if higher is a else a
        if result.name == higher.name:
            return (
                f"the {_CATEGORY_NAME[max(ca, cb)]} operand's type wins over any {_CATEGORY_NAME[min(ca, cb)]} "
                f"type, whatever the {lower.name}'s width"
            )
        return f"complex result with a component wide enough for both: {result.name}"
    if {a.name, b.name} == {"float16", "bfloat16"}:
        return "float16 and bfloat16 cannot hold each other's values (range vs precision): torch picks float32"
    if a.kind != b.kind and ca == 1:
        return "signed with unsigned: the smallest signed type that holds both"
    return "same category: the wider type wins"


def promote_pair(a: DtypeSpec, b: DtypeSpec) -> Promotion:
    import torch

    ta, tb = a.torch_dtype(), b.torch_dtype()
    assert ta is not None
    assert tb is not None
    try:
        promoted = spec_of(torch.promote_types(ta, tb))
    except (RuntimeError, TypeError) as exc:
        reason = str(exc).splitlines()[0]
        return Promotion((a.name, b.name), None, "torch refuses this promotion: cast one side explicitly", (), reason)
    found = losses(a, promoted) + losses(b, promoted)
    return Promotion((a.name, b.name), promoted.name, _rule(a, b, promoted), found)


def _scalar_rule(spec: DtypeSpec, other: str, other_category: int, result: str) -> str:
    mine = _category(spec)
    if other_category <= mine:
        return "a dimensioned tensor keeps its dtype against a scalar or 0-dim tensor of the same or lower category"
    if mine == 2 and other_category == 3:
        return f"a complex scalar turns a floating tensor complex, with a component that holds its type: {result}"
    if other.startswith("0-dim"):
        return f"a 0-dim tensor of a higher category lends its own dtype: {result}"
    article = "an" if _CATEGORY_NAME[mine][0] in "aeiou" else "a"
    return (
        f"a {_CATEGORY_NAME[other_category]} scalar lifts {article} {_CATEGORY_NAME[mine]} tensor to the default "
        f"{_CATEGORY_NAME[other_category]} dtype: {result}"
    )


def scalar_promotions(spec: DtypeSpec) -> tuple[ScalarPromotion, ...]:
    import torch

    dtype = spec.torch_dtype()
    assert dtype is not None
    tensor = torch.empty(2, dtype=dtype, device="meta")
    others: list[tuple[str, object, int]] = [
        ("python bool", True, 0),
        ("python int", 1, 1),
        ("python float", 2.5, 2),
        ("python complex", 1j, 3),
        ("0-dim float64 tensor", torch.tensor(1.0, dtype=torch.float64, device="meta"), 2),
    ]
    found: list[ScalarPromotion] = []
    for label, value, category in others:
        try:
            result = str(torch.result_type(tensor, value)).removeprefix("torch.")  # type: ignore[call-overload]
        except (RuntimeError, TypeError) as exc:
            found.append(ScalarPromotion(spec.name, label, None, str(exc).splitlines()[0]))
            continue
        found.append(ScalarPromotion(spec.name, label, result, _scalar_rule(spec, label, category, result)))
    return tuple(found)


def promote(specs: Sequence[DtypeSpec]) -> PromotionReport:
    """Every pair, the whole set folded together, and each dtype against Python scalars."""
    pairs = tuple(promote_pair(a, b) for a, b in combinations(specs, 2))
    result: str | None = specs[0].name if specs else None
    for spec in specs[1:]:
        if result is None:
            break
        result = promote_pair(lookup(result), spec).result
    scalars = tuple(s for spec in specs for s in scalar_promotions(spec))
    return PromotionReport(tuple(s.name for s in specs), result, pairs, scalars)


def defaults() -> Defaults:
    """What plain constructors produce in this process (a script's ``set_default_dtype`` changes it)."""
    import numpy
    import torch

    made = {
        "torch.tensor(1.0)": torch.tensor(1.0),
        "torch.tensor(1)": torch.tensor(1),
        "torch.tensor(True)": torch.tensor(True),
        "torch.tensor(1j)": torch.tensor(1j),
        "torch.arange(3)": torch.arange(3),
        "torch.arange(3.0)": torch.arange(3.0),
        "torch.zeros(1)": torch.zeros(1),
        "torch.full((1,), 7)": torch.full((1,), 7),
        "torch.from_numpy(numpy.zeros(1))": torch.from_numpy(numpy.zeros(1)),
    }
    return Defaults(
        default_dtype=str(torch.get_default_dtype()).removeprefix("torch."),
        constructors={expr: str(tensor.dtype).removeprefix("torch.") for expr, tensor in made.items()},
    )
