"""torch.package archives (PackageExporter): their pickles' tensors are read without importing anything, each global
resolved as PackageImporter would resolve it, and the archive's own code reported."""

from __future__ import annotations

import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.package.package_exporter import PackageExporter

from tests._ckpt_factory import load_all, opened, same
from tests.conftest import CliResult
from tests.security.harness import one_error_line


def _export(path: Path, resources: dict[str, object]) -> Path:
    with warnings.catch_warnings(), PackageExporter(str(path)) as exporter:
        warnings.simplefilter("ignore")  # (torch.package pickles TypedStorage, which torch deprecates)
        exporter.extern("torch.**")
        for where, obj in resources.items():
            package, _, resource = where.rpartition("/")
            exporter.save_pickle(package, resource, obj)
    return path


def _state_dict() -> dict[str, torch.Tensor]:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    return {
        "w": base,
        "column": base[:, 1],  # a strided view of the same storage
        "h": torch.tensor([65504.0, -0.0, 6e-8], dtype=torch.float16),
        "bf": torch.tensor([1e38, -2.5], dtype=torch.bfloat16),
        "i": torch.tensor([-(2**40), 7], dtype=torch.int64),
        "flag": torch.tensor([True, False]),
    }


def test_a_packaged_state_dict_is_read_exactly(tmp_path: Path) -> None:
    saved = _state_dict()
    path = _export(tmp_path / "sd.pt", {"model/state.pkl": saved})
    tensors = load_all(path)
    assert list(tensors) == list(saved)
    for name, value in saved.items():
        assert same(tensors[name], value), name
    with opened(path) as checkpoint:
        assert checkpoint.format == "torch-package"
        assert {f.level for f in checkpoint.findings} == {"ok"}
        assert {f.detail for f in checkpoint.findings} >= {"torch._utils._rebuild_tensor_v2", "torch.FloatStorage"}


def test_the_scan_reads_what_package_importer_loads(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    from torch.package.package_importer import PackageImporter

    path = _export(tmp_path / "sd.pt", {"model/state.pkl": _state_dict()})
    loaded = PackageImporter(str(path)).load_pickle("model", "state.pkl")  # our own archive: safe to load
    result = cli("scan-model", str(path), "--format", "json")
    assert result.exit_code == 1, result.stderr  # bf's 1e38 overflows float16: a numeric fail, nothing else
    doc = result.json()
    assert doc["format"] == "torch-package"
    assert [t["name"] for t in doc["tensors"] if t["level"] == "fail"] == ["bf"]
    assert [f for f in doc["findings"] if f["level"] == "fail"] == []
    by_name = {t["name"]: t for t in doc["tensors"]}
    for name in ("w", "column", "h", "bf"):
        assert by_name[name]["max"] == loaded[name].max().item(), name
        assert by_name[name]["min"] == loaded[name].min().item(), name
    assert by_name["h"]["casts"]["bfloat16"]["overflow"] == 0  # 65504 fits bfloat16
    assert by_name["bf"]["casts"]["float16"]["overflow"] == 1  # 1e38 does not fit float16


def test_a_whole_torch_module_needs_no_code_of_the_archive(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LayerNorm(3))
    path = _export(tmp_path / "model.pt", {"model/model.pkl": model})
    with zipfile.ZipFile(path) as archive:
        assert not [n for n in archive.namelist() if n.endswith(".py")]
    tensors = load_all(path)
    assert list(tensors) == list(model.state_dict())
    for name, value in model.state_dict().items():
        assert same(tensors[name], value), name
    with opened(path) as checkpoint:
        assert {f.level for f in checkpoint.findings} == {"ok"}


def test_several_pickles_are_named_by_their_path(tmp_path: Path) -> None:
    path = _export(tmp_path / "two.pt", {"model/a.pkl": {"w": torch.ones(2)}, "extra/b.pkl": [torch.zeros(1)]})
    assert sorted(load_all(path)) == ["extra/b.pkl.0", "model/a.pkl.w"]


def test_a_truncated_package_is_one_error_line(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    path = _export(tmp_path / "sd.pt", {"model/state.pkl": _state_dict()})
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    result = cli("scan-model", str(cut))
    assert result.exit_code == 3
    assert one_error_line(result.stderr), result.stderr
    assert "corrupt zip archive" in result.stderr


def _rewritten(source: Path, target: Path, change: Callable[[str, bytes], bytes | None], add: dict[str, bytes]) -> Path:
    """A copy of a package with each record passed through ``change`` (None drops it) and ``add`` appended."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
        prefix = old.namelist()[0].split("/")[0]
        for info in old.infolist():
            data = change(info.filename.removeprefix(prefix + "/"), old.read(info))
            if data is not None:
                new.writestr(info.filename, data)
        for name, data in add.items():
            new.writestr(f"{prefix}/{name}", data)
    return target


def test_a_torch_module_the_archive_does_not_extern_is_its_own_code(tmp_path: Path) -> None:
    """With ``torch._utils`` left out of ``extern_modules`` and shipped as source, PackageImporter would import the
    archive's ``torch/_utils.py`` for the pickle's ``torch._utils._rebuild_tensor_v2``: that global fails."""
    path = _export(tmp_path / "sd.pt", {"model/state.pkl": {"w": torch.ones(2)}})
    externs = b"collections\ntorch.storage\n"  # torch is no longer extern: torch/_utils.py is the archive's
    hostile = _rewritten(
        path,
        tmp_path / "shadow.pt",
        lambda name, data: externs if name == ".data/extern_modules" else data,
        {"torch/_utils.py": b"print('runs')\n"},
    )
    with opened(hostile) as checkpoint:
        found = {(f.kind, f.level, f.detail) for f in checkpoint.findings if f.level != "ok"}
    assert (
        "pickle-global",
        "fail",
        "torch._utils._rebuild_tensor_v2: PackageImporter imports it from the archive's own code (torch/_utils.py) "
        "and runs it",
    ) in found
    assert ("pickle-global", "fail", "torch.FloatStorage: neither in the archive nor among its extern modules "
            "(PackageImporter refuses it)") in found  # fmt: skip
    assert [level for kind, level, _ in found if kind == "contains-code"] == ["fail"]


def test_unreferenced_source_is_reported_as_code(tmp_path: Path) -> None:
    path = _export(tmp_path / "sd.pt", {"model/state.pkl": {"w": torch.ones(2)}})
    with_code = _rewritten(path, tmp_path / "code.pt", lambda _name, data: data, {"helpers.py": b"import os\n"})
    with opened(with_code) as checkpoint:
        found = [(f.kind, f.level) for f in checkpoint.findings if f.level != "ok"]
        (detail,) = [f.detail for f in checkpoint.findings if f.kind == "contains-code"]
    assert found == [("contains-code", "warn")]
    assert "(helpers.py)" in detail


def test_a_reduce_package_id_calls_its_function(tmp_path: Path) -> None:
    """``("reduce_package", id, func, args)``: PackageImporter calls ``func(importer, *args)``."""
    from tests.security.corpus import glob, program, text

    pid = b"(" + text("reduce_package") + b"K\x01" + glob("torch.serialization", "load") + b")tQ"
    path = _export(tmp_path / "sd.pt", {"model/state.pkl": {"w": torch.ones(2)}})
    hostile = _rewritten(path, tmp_path / "reduce.pt", lambda _n, d: d, {"model/other.pkl": program(pid)})
    with opened(hostile) as checkpoint:
        failed = [f.detail for f in checkpoint.findings if f.level == "fail"]
    assert failed == ["torch.serialization.load (in model/other.pkl)"]


def test_a_zip_that_is_both_a_checkpoint_and_a_package_fails(tmp_path: Path) -> None:
    path = tmp_path / "both.pt"
    torch.save({"w": torch.ones(2)}, path)
    with zipfile.ZipFile(path, "a") as archive:
        prefix = archive.namelist()[0].split("/")[0]
        archive.writestr(f"{prefix}/.data/extern_modules", "torch\n")
    with opened(path) as checkpoint:
        assert checkpoint.format == "torch-zip"  # torch.load reads its data.pkl...
        failed = [(f.kind, f.level) for f in checkpoint.findings if f.level == "fail"]
    assert failed == [("pickle-polyglot", "fail")]  # ...and PackageImporter its other pickles


@pytest.mark.parametrize("extern_modules", [None, b"\xff\xfe"])
def test_a_package_without_a_readable_extern_list_is_refused(
    tmp_path: Path, extern_modules: bytes | None, cli: Callable[..., CliResult]
) -> None:
    path = _export(tmp_path / "sd.pt", {"model/state.pkl": {"w": torch.ones(2)}})
    broken = _rewritten(
        path,
        tmp_path / "broken.pt",
        lambda name, data: extern_modules if name == ".data/extern_modules" else data,
        {},
    )
    result = cli("scan-model", str(broken))
    assert result.exit_code == 3
    assert one_error_line(result.stderr), result.stderr
