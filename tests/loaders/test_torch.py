"""torch zip and legacy checkpoints: names, dtypes, shapes and exact values against the tensors that were saved."""

from __future__ import annotations

import argparse
import io
import pickletools
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from dtypecheck.errors import InputError
from dtypecheck.loaders import open_checkpoint
from tests._ckpt_factory import load_all, opened, read_tensor, same, saved_as_if_on


class FakeDictConfig:
    """Stands in for omegaconf.DictConfig: a custom class pickled with a state dict holding content."""

    def __init__(self, content: dict[str, object]) -> None:
        self._content = content

    def __getstate__(self) -> dict[str, object]:
        return {"_content": self._content, "_metadata": {"flags": None}}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._content = state["_content"]  # type: ignore[assignment]


def _all_dtypes() -> dict[str, torch.Tensor]:
    values = torch.tensor([0.0, -1.5, 3.25, 1e-3, 448.0, -0.0])
    return {
        "f32": values.clone(),
        "f64": values.double(),
        "f16": values.half(),
        "bf16": values.bfloat16(),
        "e4m3": values.to(torch.float8_e4m3fn),
        "e5m2": values.to(torch.float8_e5m2),
        "c64": torch.complex(values, -values),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "i64": torch.tensor([-(2**62), 5], dtype=torch.int64),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(7.5),
        "int_scalar": torch.tensor(-3, dtype=torch.int32),
        "empty": torch.empty(0, 4),
        "nan_inf": torch.tensor([float("nan"), float("inf"), -float("inf")]),
    }


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_every_dtype_round_trips_exactly(tmp_path: Path, zip_format: bool) -> None:
    tensors = _all_dtypes()
    path = tmp_path / "all.pt"
    torch.save(tensors, path, _use_new_zipfile_serialization=zip_format)
    with opened(path) as checkpoint:
        assert checkpoint.format == ("torch-zip" if zip_format else "torch-legacy")
        records = {r.name: r for r in checkpoint.records()}
        assert list(records) == list(tensors)
        for name, expected in tensors.items():
            record = records[name]
            assert record.dtype == str(expected.dtype).removeprefix("torch.")
            assert record.shape == tuple(expected.shape)
            assert record.nbytes == expected.numel() * expected.element_size()
            assert record.saved_device == "cpu"
            assert same(read_tensor(record, max_bytes=4), expected), name
        assert {f.level for f in checkpoint.findings} == {"ok"}


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_views_shared_storage_and_strides(tmp_path: Path, zip_format: bool) -> None:
    base = torch.arange(60, dtype=torch.float32).reshape(5, 12)
    tensors = {
        "base": base,
        "rows": base[1:3],  # contiguous view with a storage offset
        "transposed": base.t(),  # non-contiguous
        "columns": base[:, 2:9:3],  # strided
        "expanded": torch.tensor([1.0, 2.0]).expand(4, 2),  # stride 0
        "tied": base,  # the same tensor under two keys
    }
    path = tmp_path / "views.pt"
    torch.save(tensors, path, _use_new_zipfile_serialization=zip_format)
    for max_bytes in (4, 20, 1 << 20):
        loaded = load_all(path, max_bytes)
        assert list(loaded) == list(tensors)
        for name, expected in tensors.items():
            assert same(loaded[name], expected.contiguous()), (name, max_bytes)


def test_gpu_saved_file_scans_on_cpu(tmp_path: Path) -> None:
    tensors = {"w": torch.linspace(-2, 2, 7), "b": torch.tensor([1, 2, 3], dtype=torch.int16)}
    path = tmp_path / "gpu.pt"
    with saved_as_if_on("cuda:0"):
        torch.save(tensors, path)
    pickled = zipfile.ZipFile(path).read("gpu/data.pkl")
    text = io.StringIO()
    pickletools.dis(pickled, out=text)
    assert text.getvalue().count("'cuda:0'") >= 1  # the file really says cuda:0, as a GPU save does
    with opened(path) as checkpoint:
        records = {r.name: r for r in checkpoint.records()}
        assert {r.saved_device for r in records.values()} == {"cuda:0"}
        for name, expected in tensors.items():
            assert same(read_tensor(records[name]), expected)
    # torch itself agrees on the values when told to map cuda to cpu (our own trusted file)
    reference = torch.load(path, map_location="cpu", weights_only=True)
    assert same(reference["w"], tensors["w"])


def test_lightning_checkpoint_with_optimizer_and_custom_hyper_parameters(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    namespace = argparse.Namespace(lr=1e-3, mask=torch.tensor([1.0, 0.0]))
    checkpoint = {
        "epoch": 3,
        "state_dict": OrderedDict((f"model.{k}", v) for k, v in model.state_dict().items()),
        "optimizer_states": [optimizer.state_dict()],
        "hyper_parameters": {"args": namespace, "cfg": FakeDictConfig({"scale": torch.tensor(2.0)})},
    }
    path = tmp_path / "last.ckpt"
    torch.save(checkpoint, path)
    loaded = load_all(path)
    state = optimizer.state_dict()["state"]
    linear_in, linear_out = model[0], model[2]
    assert isinstance(linear_in, torch.nn.Linear)
    assert isinstance(linear_out, torch.nn.Linear)
    assert same(loaded["state_dict.model.0.weight"], linear_in.weight.detach())
    assert same(loaded["state_dict.model.2.bias"], linear_out.bias.detach())
    assert same(loaded["optimizer_states.0.state.0.exp_avg_sq"], state[0]["exp_avg_sq"])
    assert same(loaded["optimizer_states.0.state.3.exp_avg"], state[3]["exp_avg"])
    assert same(loaded["optimizer_states.0.state.1.step"], state[1]["step"])
    assert same(loaded["hyper_parameters.args.mask"], namespace.mask)
    assert same(loaded["hyper_parameters.cfg._content.scale"], torch.tensor(2.0))
    with opened(path) as opened_checkpoint:
        levels = {f.detail: f.level for f in opened_checkpoint.findings if f.kind == "pickle-global"}
    assert levels["argparse.Namespace"] == "ok"
    assert levels[f"{__name__}.FakeDictConfig"] == "fail"  # unvetted (issue 27): importing it runs its code
    assert levels["torch._utils._rebuild_tensor_v2"] == "ok"


def test_plain_tensor_root_and_parameter(tmp_path: Path) -> None:
    path = tmp_path / "one.pt"
    parameter = torch.nn.Parameter(torch.tensor([[1.0, 2.0]]))
    torch.save(parameter, path)
    loaded = load_all(path)
    assert list(loaded) == ["(root)"]
    assert same(loaded["(root)"], parameter.detach())


def test_records_read_headers_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.pt"
    torch.save({"a": torch.ones(3, 2), "b": torch.zeros(4, dtype=torch.bfloat16)}, path)

    def no_data(*_args: object) -> None:
        raise AssertionError("tensor data was read")

    monkeypatch.setattr("dtypecheck.loaders._io.mapped._frombuffer", no_data)
    with opened(path) as checkpoint:
        assert [(r.name, r.dtype, r.shape) for r in checkpoint.records()] == [
            ("a", "float32", (3, 2)),
            ("b", "bfloat16", (4,)),
        ]


def test_content_not_extension_decides(tmp_path: Path) -> None:
    path = tmp_path / "weights.safetensors"  # a torch zip with a misleading name
    torch.save({"x": torch.tensor([1.0])}, path)
    with opened(path) as checkpoint:
        assert checkpoint.format == "torch-zip"


def test_zip_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "notes.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(InputError, match=r"notes\.pt: zip archive is not a torch checkpoint"):
        open_checkpoint(str(path))


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_truncated_zip(tmp_path: Path, cut: float) -> None:
    path = tmp_path / "t.pt"
    torch.save({"x": torch.arange(1000.0)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(InputError, match=r"t\.pt: "):
        open_checkpoint(str(path))


def test_corrupt_zip_central_directory(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"x": torch.arange(10.0)}, path)
    data = bytearray(path.read_bytes())
    central = data.rfind(b"PK\x01\x02")
    data[central + 42 : central + 46] = (10**9).to_bytes(4, "little")  # local header offset beyond the file
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"c\.pt: "):
        open_checkpoint(str(path))


def test_compressed_storage_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "s.pt"
    torch.save({"x": torch.arange(10.0)}, source)
    target = tmp_path / "deflated.pt"
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as rewritten:
        for info in original.infolist():
            rewritten.writestr(info.filename, original.read(info.filename))
    with pytest.raises(InputError, match="compressed"):
        open_checkpoint(str(target))


def test_truncated_legacy_file(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save({"x": torch.arange(100.0)}, path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(InputError, match=r"old\.pt: storage .* runs past the end"):
        open_checkpoint(str(path))


def test_whole_pickled_module_and_torchscript_use_state_dict_names(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    expected = model.state_dict()
    torch.save(model, tmp_path / "full.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated but its files live on
        torch.jit.save(torch.jit.script(model), tmp_path / "scripted.pt")
    for name in ("full.pt", "scripted.pt"):
        loaded = load_all(tmp_path / name)
        assert list(loaded) == list(expected), name
        for key, tensor in expected.items():
            assert same(loaded[key], tensor), (name, key)
    with opened(tmp_path / "full.pt") as checkpoint:
        assert {f.level for f in checkpoint.findings} == {"ok"}  # torch.nn classes: rebuilt from data only


def test_numpy_rng_state_is_harmless(tmp_path: Path) -> None:
    import numpy as np

    path = tmp_path / "rng.pt"
    torch.save({"rng": np.random.default_rng(0), "legacy_rng": np.random.get_state(), "t": torch.ones(1)}, path)
    with opened(path) as checkpoint:
        assert [r.name for r in checkpoint.records()] == ["t"]
        assert {f.level for f in checkpoint.findings} == {"ok"}


def test_meta_quantized_and_sparse_tensors_are_reported_not_crashed_on(tmp_path: Path) -> None:
    path = tmp_path / "odd.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # quantized tensors are deprecated
        quantized = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    plain = torch.tensor([2.0])
    torch.save(
        {"meta": torch.empty(3, 4, device="meta"), "q": quantized, "sparse": torch.eye(2).to_sparse(), "x": plain}, path
    )
    with opened(path) as checkpoint:
        records = list(checkpoint.records())
        skipped = {(f.tensor, f.detail) for f in checkpoint.findings if f.kind == "unsupported-tensor"}
        assert {f.level for f in checkpoint.findings if f.kind == "pickle-global"} == {"ok"}
        assert [r.name for r in records] == ["x"]
        assert same(read_tensor(records[0]), plain)
    assert skipped == {
        ("meta", "meta (no data) tensor not scanned"),
        ("q", "quantized tensor not scanned"),
        ("sparse", "sparse tensor not scanned"),
    }
