"""TorchScript archives (torch.jit.save): their tensors are read without running anything, one "contains code"
finding replaces TorchScript's own globals, and any other global is still judged.

No ``from __future__ import annotations`` here: torch.jit.script reads the class annotations as real types."""

import zipfile
from pathlib import Path

import pytest
import torch

from tests._ckpt_factory import load_all, opened, same

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning", "ignore::torch.jit.TracerWarning")


class Scripted(torch.nn.Module):
    sizes: list[int]
    ratios: list[float]
    scale: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.norm = torch.nn.BatchNorm2d(2)
        self.register_buffer("scale", torch.tensor([2.0, 0.25]))
        self.sizes = [1, 2, 3]  # pickled through torch.jit._pickle.build_intlist
        self.ratios = [0.5]  # ... and build_doublelist

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(self.conv(x))
        return out * self.scale[0] + self.sizes[0] * self.ratios[0]


class Traced(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x)
        return out + torch.tensor([1.5, -1.5])  # traced: becomes a tensor in constants.pkl


def test_scripted_module_tensors_are_its_state_dict(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Scripted()
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(model), path)
    tensors = load_all(path)
    expected = model.state_dict()
    assert set(tensors) == set(expected)
    for name, value in expected.items():
        assert same(tensors[name], value), name
    with opened(path) as checkpoint:
        assert checkpoint.format == "torchscript"
        findings = [(f.kind, f.level) for f in checkpoint.findings if f.level != "ok"]
        details = " ".join(f.detail for f in checkpoint.findings)
    assert findings == [("contains-code", "fail")]
    assert "build_intlist" not in details
    assert "__torch__" not in details


def test_traced_constants_are_read_from_constants_pkl(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Traced()
    path = tmp_path / "traced.pt"
    torch.jit.save(torch.jit.trace(model, torch.ones(1, 3)), path)
    tensors = load_all(path)
    assert set(tensors) == {"fc.weight", "fc.bias", "constants.0"}
    assert same(tensors["fc.weight"], model.fc.weight.detach())
    assert same(tensors["constants.0"], torch.tensor([1.5, -1.5]))


class Containers(torch.nn.Module):
    tensors: list[torch.Tensor]
    named: dict[str, torch.Tensor]

    def __init__(self) -> None:
        super().__init__()
        self.tensors = [torch.ones(2), torch.zeros(3)]  # build_tensorlist
        self.named = {"a": torch.full((2,), 3.0)}  # restore_type_tag

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.tensors[0] + self.named["a"]


def test_tensors_in_list_and_dict_attributes_are_named_by_their_index_and_key(tmp_path: Path) -> None:
    path = tmp_path / "containers.pt"
    torch.jit.save(torch.jit.script(Containers()), path)
    tensors = load_all(path)
    assert list(tensors) == ["tensors.0", "tensors.1", "named.a"]
    assert same(tensors["tensors.1"], torch.zeros(3))
    assert same(tensors["named.a"], torch.full((2,), 3.0))


def test_cli_reports_one_code_finding_and_fails(cli, tmp_path: Path) -> None:
    """torch.jit.load compiles the archive's code and runs it while loading (a ``__setstate__`` runs as the
    module is unpickled): code in a checkpoint fails the gate, and is the only failure of this one."""
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(Scripted()), path)
    result = cli("scan-model", str(path), "--format", "json")
    assert result.exit_code == 1, result.stderr
    doc = result.json()
    assert doc["format"] == "torchscript"
    code = [f for f in doc["findings"] if f["kind"] == "contains-code"]
    assert len(code) == 1
    assert code[0]["level"] == "fail"
    assert "torch.jit.load" in code[0]["detail"]
    assert "safetensors" in code[0]["detail"]  # says what to do instead
    assert [f["kind"] for f in doc["findings"] if f["level"] == "fail"] == ["contains-code"]
    assert doc["summary"]["tensors"] == 8  # conv 2, norm 5, scale 1
    scale = next(t for t in doc["tensors"] if t["name"] == "scale")
    assert (scale["min"], scale["max"]) == (0.25, 2.0)


def test_a_dangerous_global_inside_a_torchscript_archive_still_fails(cli, tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    # os.system("true") as REDUCE, protocol 2: the safe unpickler never calls it.
    evil = b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("evil/data.pkl", evil)
        archive.writestr("evil/constants.pkl", b"\x80\x02).")
        archive.writestr("evil/code/__torch__.py", "class M(Module):\n  pass\n")
        archive.writestr("evil/version", b"3\n")
    result = cli("scan-model", str(path), "--format", "json")
    doc = result.json()
    assert doc["format"] == "torchscript"
    failing = [f["detail"] for f in doc["findings"] if f["level"] == "fail"]
    assert any(detail.endswith(".system") for detail in failing), doc["findings"]
    assert result.exit_code == 1
