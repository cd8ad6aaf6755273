"""Issue 27, class 2: each file is judged as torch.load would dispatch it, and as the scan read it.

Every payload of ``gate/readings.py`` is proven live (its canary appears under ``torch.load(weights_only=False)``
or ``torch.jit.load`` in a throwaway process) and fails the default gate with the finding that names the reading
torch would take; the benign look-alikes pass.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from dtypecheck.loaders._io.zip_records import read_zip_entries, record_key
from tests.conftest import CliResult
from tests.security.corpus import Hostile
from tests.security.gate import readings
from tests.security.harness import prove_live

POLYGLOTS = (
    "safetensors-tar-polyglot",
    "gguf-tar-polyglot",
    "legacy-tar-polyglot",
    "safetensors-zip-polyglot",
    "polyglot-shard",
    "polyglot-lone-file",
)
ZIP_NAMES = ("zip-Data-pkl", "zip-DATA-PKL", "zip-upper-storages", "zip-case-twin-data-pkl", "zip-DATA-PKL-side-file")
TORCHSCRIPT = ("torchscript-setstate", "torchscript-via-torch-load")
TORCH_PACKAGE = ("torch-package-interned",)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Hostile]:
    return {h.name: h for h in readings.build(tmp_path_factory.mktemp("readings"))}


def test_the_corpus_is_what_the_tests_name(built: dict[str, Hostile]) -> None:
    payloads = {name for name, h in built.items() if not h.benign}
    assert payloads == {*POLYGLOTS, *ZIP_NAMES, *TORCHSCRIPT, *TORCH_PACKAGE}
    assert all(h.klass == "readings" for h in built.values())
    assert all(h.canary is not None and h.torch_load is not None for name, h in built.items() if name in payloads)


def test_every_payload_is_live(built: dict[str, Hostile]) -> None:
    payloads = [h for h in built.values() if not h.benign]
    assert prove_live(payloads) == {h.name for h in payloads}


def _scan_payload(hostile: Hostile, cli: Callable[..., CliResult]) -> tuple[CliResult, dict[str, list[str]]]:
    """Scan one payload (its canary removed first): the result, which fails the gate without running the payload,
    and its ``fail`` findings by kind."""
    assert hostile.canary is not None
    hostile.canary.unlink(missing_ok=True)
    result = cli(*hostile.args, "--format", "json")
    assert result.exit_code == 1, result.stderr
    assert not hostile.canary.exists()
    return result, _fails(result)


def _fails(result: CliResult) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for finding in result.json()["findings"]:
        if finding["level"] == "fail":
            found.setdefault(finding["kind"], []).append(finding["detail"])
    return found


@pytest.mark.parametrize("name", POLYGLOTS)
def test_a_polyglot_fails_in_the_reading_torch_takes(
    name: str, built: dict[str, Hostile], cli: Callable[..., CliResult]
) -> None:
    _, fails = _scan_payload(built[name], cli)
    assert "pickle-polyglot" in fails, fails
    reading = "a torch.save zip" if "zip" in name else "a legacy torch.save tar"
    assert any(f"is also {reading}" in detail for detail in fails["pickle-polyglot"]), fails
    # the payload torch would run is named: exec for the zip's data.pkl, pickle's own reduce for the tar's
    assert any(d.startswith(("builtins.exec", "builtins.exec ")) for d in fails["pickle-global"]), fails


def test_the_polyglots_are_valid_in_their_other_format(built: dict[str, Hostile]) -> None:
    """Each polyglot is what the scan took it for, read by that format's own reference reader."""
    import gguf
    from safetensors import safe_open

    for name in ("safetensors-tar-polyglot", "safetensors-zip-polyglot"):
        path = built[name].torch_load
        assert path is not None
        with safe_open(str(path), "np") as opened:
            keys = list(opened.keys())
            (tensor,) = [opened.get_tensor(k) for k in keys]
        assert tensor.dtype.name == "uint8"
        raw = path.read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        assert tensor.tobytes() == raw[8 + length :]  # the zip or tar is the tensor's data
    reader = gguf.GGUFReader(str(built["gguf-tar-polyglot"].torch_load))
    assert [t.name for t in reader.tensors] == ["w"]
    assert reader.tensors[0].data.tolist() == [1.0]


def test_the_legacy_polyglot_scans_its_tensors_and_fails(
    built: dict[str, Hostile], cli: Callable[..., CliResult]
) -> None:
    result = cli(*built["legacy-tar-polyglot"].args, "--format", "json")
    doc = result.json()
    assert doc["format"] == "torch-legacy"
    assert {t["name"]: t["max"] for t in doc["tensors"]}["w"] == 1.0


@pytest.mark.parametrize("name", ZIP_NAMES)
def test_zip_names_are_matched_as_torch_matches_them(
    name: str, built: dict[str, Hostile], cli: Callable[..., CliResult]
) -> None:
    result, fails = _scan_payload(built[name], cli)
    assert any(d.startswith("builtins.exec") for d in fails["pickle-global"]), fails
    if name == "zip-case-twin-data-pkl":
        assert any("data.pkl appears 2 times" in d for d in fails["duplicate-entry"]), fails
    if name != "zip-DATA-PKL-side-file":
        assert [t["name"] for t in result.json()["tensors"]] == ["w"]  # its storage found as torch finds it


def test_torch_reads_the_names_the_scan_folds(built: dict[str, Hostile]) -> None:
    """The oracle is torch's own reader: ``get_record("data.pkl")`` returns the entry spelt ``DATA.PKL``, and
    ``data/0`` the one spelt ``DATA/0``; the scan's folded names find the same bytes."""
    import mmap

    import torch

    for name, record, spelt in (
        ("zip-DATA-PKL", "data.pkl", "archive/DATA.PKL"),
        ("zip-Data-pkl", "data.pkl", "archive/Data.pkl"),
        ("zip-upper-storages", "data/0", "archive/DATA/0"),
    ):
        path = built[name].torch_load
        assert path is not None
        with zipfile.ZipFile(path) as archive:
            written = archive.read(spelt)
        reader = torch._C.PyTorchFileReader(str(path))
        assert bytes(reader.get_record(record)) == written
        with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            entries = read_zip_entries(buffer, 0, len(buffer), str(path))
            (entry,) = entries["archive/" + record]
            assert buffer[entry.offset : entry.offset + entry.size] == written


def test_record_key_folds_ascii_letters_only() -> None:
    # miniz's MZ_TOLOWER: 'A'..'Z' only; a non-ASCII capital stays what it is (str.lower would change it)
    assert record_key("Archive/DATA.PKL") == "archive/data.pkl"
    assert record_key("archive/ÄDATA") == "archive/Ädata"
    assert record_key("archive/İ") == "archive/İ"


@pytest.mark.parametrize("name", TORCHSCRIPT)
def test_torchscript_code_fails(name: str, built: dict[str, Hostile], cli: Callable[..., CliResult]) -> None:
    hostile = built[name]
    result = cli(*hostile.args, "--format", "json")
    assert result.exit_code == 1, result.stderr
    doc = result.json()
    assert doc["format"] == "torchscript"
    assert [d for d in _fails(result)["contains-code"] if "torch.jit.load compiles and runs" in d]
    path = hostile.torch_load
    assert path is not None
    with zipfile.ZipFile(path) as archive:  # the code that runs is in the archive, as the detail says
        code = [n for n in archive.namelist() if "/code/" in n and n.endswith(".py")]
        assert any(b"torch.from_file" in archive.read(n) for n in code)


def test_an_archive_with_constants_pkl_is_read_as_torchscript(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """torch.load hands any zip whose records include ``constants.pkl`` to torch.jit.load (no ``code/`` needed):
    the scan takes the same turn."""
    import torch

    from dtypecheck.loaders.formats import detect

    path = tmp_path / "constants.pt"
    torch.save({"w": torch.ones(2)}, path)
    with zipfile.ZipFile(path, "a") as archive:
        prefix = archive.namelist()[0].split("/")[0]
        archive.writestr(f"{prefix}/constants.pkl", b"\x80\x02).")
    assert "constants.pkl" in torch._C.PyTorchFileReader(str(path)).get_all_records()
    found = detect(path)
    assert found is not None
    assert found.name == "torchscript"


def test_a_torch_package_fails_on_the_code_it_interns(built: dict[str, Hostile], cli: Callable[..., CliResult]) -> None:
    """PackageImporter.load_pickle compiles and runs the module source the archive ships for the pickled class: the
    scan reads the module's tensors without it and fails on that code."""
    result, fails = _scan_payload(built["torch-package-interned"], cli)
    doc = result.json()
    assert doc["format"] == "torch-package"
    assert [t["name"] for t in doc["tensors"]] == ["fc.weight", "fc.bias"]  # as state_dict() names them
    (shipped,) = [d for d in fails["pickle-global"] if d.startswith("packaged_")]
    assert "PackageImporter imports it from the archive's own code" in shipped
    (code,) = fails["contains-code"]
    path = built["torch-package-interned"].torch_load
    assert path is not None
    with zipfile.ZipFile(path) as archive:  # the source it names is the one in the archive, payload and all
        (source,) = [n for n in archive.namelist() if n.endswith(".py")]
        assert source.split("/", 1)[1] in code
        assert b"__torch_package__" in archive.read(source)


@pytest.mark.parametrize("name", ["benign-storages-named", "benign-torch-zip", "benign-torch-package"])
def test_benign_look_alikes_pass(name: str, built: dict[str, Hostile], cli: Callable[..., CliResult]) -> None:
    result = cli(*built[name].args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert _fails(result) == {}
    assert not any(f["kind"] == "pickle-polyglot" for f in result.json()["findings"])


def test_a_plain_safetensors_file_reads_as_no_tar(built: dict[str, Hostile]) -> None:
    """The look-alike's tensor names are a tar's member names, but its first 512 bytes are no tar header."""
    import tarfile

    path = Path(built["benign-storages-named"].args[1])
    with pytest.raises(tarfile.ReadError), tarfile.open(path, "r:"):
        pass
    header = json.loads(path.read_bytes()[8 : 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]])
    assert {"storages", "tensors"} <= set(header)
