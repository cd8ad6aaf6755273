"""Type promotion explained: torch's results, the deciding rule, and losses derived by hand from the limits."""

from __future__ import annotations

import pytest
import torch

from dtypecheck.dtypes import lookup
from dtypecheck.promotion import defaults, promote, promote_pair, scalar_promotions


def _pair(a: str, b: str):
    return promote_pair(lookup(a), lookup(b))


def test_results_are_torchs_own() -> None:
    for a, b in [("fp16", "bf16"), ("int8", "uint8"), ("int64", "fp16"), ("complex32", "fp32"), ("bool", "int8")]:
        expected = torch.promote_types(lookup(a).torch_dtype(), lookup(b).torch_dtype())  # type: ignore[arg-type]
        assert _pair(a, b).result == str(expected).removeprefix("torch.")


def test_float16_with_int32_is_flagged_as_losing_range() -> None:
    pair = _pair("fp16", "int32")
    assert pair.result == "float16"
    # int32's max 2**31 - 1 is far beyond float16's 65504; integers beyond 2**11 are not all exact.
    assert pair.losses == (
        "int32 values beyond ±65504 overflow to inf in float16",
        "int32 integers above 2,048 are rounded in float16",
    )
    assert "whatever the int32's width" in pair.rule


def test_lossless_promotions_say_nothing_is_lost() -> None:
    assert _pair("fp16", "int8").losses == ()  # int8's 127 is exact in float16
    assert _pair("uint8", "int8").result == "int16"
    assert _pair("uint8", "int8").losses == ()
    assert "signed with unsigned" in _pair("uint8", "int8").rule
    assert "picks float32" in _pair("fp16", "bf16").rule


def test_int64_into_float32_keeps_range_but_not_exactness() -> None:
    assert _pair("int64", "fp32").losses == ("int64 integers above 16,777,216 are rounded in float32",)


def test_refused_promotions_carry_torchs_reason() -> None:
    pair = _pair("e4m3", "fp16")
    assert pair.result is None
    assert pair.error is not None
    assert "Float8" in pair.error
    report = promote([lookup("fp16"), lookup("bf16"), lookup("e4m3")])
    assert report.result is None
    assert len(report.pairs) == 3


def test_fold_over_the_whole_set() -> None:
    assert promote([lookup("fp16"), lookup("bf16"), lookup("int8")]).result == "float32"


def test_scalars_follow_categories() -> None:
    by_other = {s.other: s for s in scalar_promotions(lookup("int32"))}
    assert by_other["python int"].result == "int32"
    assert by_other["python float"].result == "float32"
    assert "default floating dtype" in by_other["python float"].rule
    assert by_other["0-dim float64 tensor"].result == "float64"
    fp16 = {s.other: s for s in scalar_promotions(lookup("fp16"))}
    assert fp16["python float"].result == "float16"
    assert fp16["0-dim float64 tensor"].result == "float16"


def test_defaults_follow_set_default_dtype() -> None:
    assert defaults().constructors["torch.tensor(1.0)"] == "float32"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        changed = defaults()
    finally:
        torch.set_default_dtype(previous)
    assert changed.default_dtype == "float64"
    assert changed.constructors["torch.tensor(1.0)"] == "float64"
    assert changed.constructors["torch.tensor(1)"] == "int64"


def test_cli_promote_json_and_usage_error(cli) -> None:
    result = cli("info", "--promote", "fp16", "int32", "--format", "json")
    assert result.exit_code == 0
    doc = result.json()
    assert doc["promotion"]["result"] == "float16"
    assert doc["promotion"]["pairs"][0]["inputs"] == ["float16", "int32"]
    assert doc["defaults"]["default_dtype"] == "float32"
    lonely = cli("info", "--promote", "fp16")
    assert lonely.exit_code == 2
    assert lonely.stderr.startswith("error: --promote needs at least two dtypes")


@pytest.mark.parametrize("width", [100])
def test_promotion_table_golden(golden, width: int) -> None:
    import dataclasses

    from dtypecheck.info import describe_dtypes
    from dtypecheck.render import OutputFormat, render

    report = describe_dtypes([lookup("fp16"), lookup("bf16"), lookup("int32")], devices=["cpu"], with_promotion=True)
    report = dataclasses.replace(report, torch_version="(pinned)")
    golden("info_promote.txt", render(report, OutputFormat.table, width=width))
