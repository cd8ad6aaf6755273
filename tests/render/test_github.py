"""``--format github``: exact workflow-command lines, each count derived by hand from the input's values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests._documents import NAN_SCRIPT, write_checkpoint


def test_every_scan_check_is_one_annotation_in_report_order(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_checkpoint(tmp_path)
    result = cli("scan-model", "tiny.safetensors", "--target", "fp16,bf16,e4m3,int8", "--format", "github", "-q")
    # layer.weight = [1, 1e-10, nan, 7e4, 0.5, -2, 1e-6, 3] (8 values):
    # float16: 7e4 > 65520 overflows; 1e-10 < 2**-25 flushes; 2**-25 <= 1e-6 < 2**-14 is subnormal.
    # bfloat16 holds them all. float8_e4m3fn: 7e4 > 464 overflows; 1e-10 and 1e-6 < 2**-10 flush; scaled by
    # 448 / 7e4 = 0.0064 they are 6.4e-13 and 6.4e-9, still below 2**-10, while 0.0064 * 0.5 = 0.0032 stays.
    # float8 is judged after scaling (docs/contract.md "Levels"): its unscaled underflow is reported, not annotated.
    # int8: 7e4 > 127 overflows (the NaN is counted once, as a non-finite value).
    head = "file=tiny.safetensors,title="
    assert result.stdout.splitlines() == [
        f"::error {head}DTC101 nonfinite-values::layer.weight: 1 nan in float32",
        f"::error {head}DTC102 cast-overflow::layer.weight: 1 of 8 values overflow in float16",
        f"::warning {head}DTC103 cast-underflow::layer.weight: 1 of 8 values underflow in float16",
        f"::warning {head}DTC104 cast-subnormal::layer.weight: 1 of 8 values subnormal in float16",
        f"::error {head}DTC102 cast-overflow::layer.weight: 1 of 8 values overflow in float8_e4m3fn",
        f"::warning {head}DTC105 scaled-underflow::layer.weight: 2 of 8 values scaled_underflow in float8_e4m3fn",
        f"::error {head}DTC102 cast-overflow::layer.weight: 1 of 8 values overflow in int8",
        f"::warning {head}DTC120 dtype-consistency::dtype-consistency: minority-dtype: 1 bfloat16 tensor(s) in a "
        "float32 model (silently promotes or mismatches where it meets the rest): norm.weight",
    ]
    assert (result.exit_code, result.stderr) == (1, "")


def test_properties_and_messages_are_escaped(cli, tmp_path: Path, monkeypatch) -> None:
    # GitHub reads "::" and "," as separators in properties and a newline as the end of the command.
    monkeypatch.chdir(tmp_path)
    save_file({"a%b\nc": torch.tensor([float("inf")])}, "m,1:x.safetensors")
    result = cli("scan-model", "m,1:x.safetensors", "--format", "github", "-q")
    assert result.stdout == (
        "::error file=m%2C1%3Ax.safetensors,title=DTC101 nonfinite-values::a%25b%0Ac: 1 posinf in float32\n"
    )
    assert result.exit_code == 1


def test_a_nan_trace_producer_is_an_error_at_its_line(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("nan_step.py").write_text(NAN_SCRIPT, encoding="utf-8")
    result = cli("nan-trace", "nan_step.py", "--format", "github", "-q")
    line = NAN_SCRIPT.splitlines().index("loss = torch.log(model(x) - 100).sum()  # the first NaN") + 1
    assert result.stdout == (
        f"::error file=nan_step.py,line={line},title=DTC201 nonfinite-producer::"
        "nan from aten.log.default in forward (invalid_math)\n"
    )
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("dtype", "expected"), [("fp16", ""), ("e5m2fnuz", "eps is 0.125, the format's true value is 0.25")]
)
def test_info_mismatches_are_notices(cli, dtype: str, expected: str) -> None:
    # float8_e5m2fnuz has 2 mantissa bits: eps = 2**-2, where torch.finfo says 2**-3.
    result = cli("info", dtype, "--format", "github")
    notice = f"::notice title=DTC001 finfo-mismatch::torch.finfo(float8_e5m2fnuz).{expected}\n" if expected else ""
    assert (result.exit_code, result.stdout) == (0, notice)
