"""``dtypecheck info --list``: every dtype name of this torch build, checked against the registry and torch."""

from __future__ import annotations

import torch

from dtypecheck.dtypes import REGISTRY, lookup
from dtypecheck.info import list_dtypes

TORCH_DTYPES = {str(v).removeprefix("torch.") for v in vars(torch).values() if isinstance(v, torch.dtype)}


def test_list_is_the_registry_restricted_to_this_torch() -> None:
    report = list_dtypes()
    listed = [d.name for d in report.dtypes]
    assert listed == [s.name for s in REGISTRY if s.name in TORCH_DTYPES]
    assert set(report.not_in_this_torch) == {s.name for s in REGISTRY} - TORCH_DTYPES
    # Every torch dtype is either listed or named as one dtypecheck does not describe: nothing is dropped.
    assert set(listed) | set(report.not_described) == TORCH_DTYPES
    assert not set(listed) & set(report.not_described)
    assert report.torch_version == torch.__version__


def test_every_listed_spelling_resolves_to_its_dtype_with_the_right_size() -> None:
    for entry in list_dtypes().dtypes:
        dtype = getattr(torch, entry.name)
        for spelling in (entry.name, f"torch.{entry.name}", entry.name.upper(), *entry.aliases):
            assert lookup(spelling).name == entry.name, spelling
        # One torch element holds `packed` values of `bits` each (sub-byte integers still take a byte).
        assert dtype.itemsize * 8 == max(8, entry.bits * entry.packed), entry.name
        assert entry.kind == _torch_kind(dtype), entry.name


def _torch_kind(dtype: torch.dtype) -> str:
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "float"
    if dtype == torch.bool:
        return "bool"
    # torch.iinfo-style signedness; quantized types refuse is_signed, their names say it (qint8, quint8).
    signed = not str(dtype).startswith("torch.qu") if "qint" in str(dtype) or "quint" in str(dtype) else dtype.is_signed
    return "int" if signed else "uint"


def test_list_cli_table_and_json_agree(cli) -> None:
    doc = cli("info", "--list", "--format", "json").json()
    assert doc["schema"] == "dtypecheck.info-list/1"
    names = [d["name"] for d in doc["dtypes"]]
    assert names == [d.name for d in list_dtypes().dtypes]
    fp16 = doc["dtypes"][names.index("float16")]
    assert fp16 == {"name": "float16", "kind": "float", "bits": 16, "packed": 1, "aliases": ["half", "fp16", "f16"]}
    table = cli("info", "--list")
    assert table.exit_code == 0
    assert table.stderr == ""
    for name in names:
        assert f"│ {name} " in table.stdout, name
    assert "half, fp16, f16" in table.stdout


def test_list_does_not_combine_with_names_all_or_promote(cli) -> None:
    for args in (("fp16",), ("--all",), ("--promote", "fp16", "bf16")):
        result = cli("info", "--list", *args)
        assert result.exit_code == 2
        assert result.stdout == ""
        assert result.stderr.startswith("error: --list ")
        assert result.stderr.count("\n") == 1


def test_unknown_dtype_hint_points_to_a_command_that_exists(cli) -> None:
    bad = cli("info", "zzzzzz")
    assert bad.exit_code == 2
    assert "run 'dtypecheck info --list' for the names" in bad.stderr
    assert cli("info", "--list").exit_code == 0
