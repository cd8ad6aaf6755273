"""safetensors files, Hugging Face sharded folders, model folders and torch.distributed.checkpoint folders."""

from __future__ import annotations

import json
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.loaders import open_checkpoint
from tests._ckpt_factory import load_all, opened, read_tensor, same


def _sharded(folder: Path, index_total: int | None = None) -> dict[str, torch.Tensor]:
    first = {"embed.weight": torch.randn(4, 3), "layers.0.w": torch.arange(6, dtype=torch.float16).reshape(2, 3)}
    second = {"layers.1.w": torch.tensor([1.0, -1.0], dtype=torch.bfloat16), "head.bias": torch.zeros(0)}
    save_file(first, folder / "model-00001-of-00002.safetensors")
    save_file(second, folder / "model-00002-of-00002.safetensors")
    weight_map = dict.fromkeys(first, "model-00001-of-00002.safetensors")
    weight_map |= dict.fromkeys(second, "model-00002-of-00002.safetensors")
    total = sum(t.numel() * t.element_size() for t in [*first.values(), *second.values()])
    index = {"metadata": {"total_size": total if index_total is None else index_total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return first | second


def test_safetensors_round_trip(tmp_path: Path) -> None:
    tensors = {
        "a": torch.randn(5, 7),
        "e4m3": torch.tensor([1.0, -448.0, 0.015625]).to(torch.float8_e4m3fn),
        "c": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
        "flags": torch.tensor([True, False]),
        "scalar": torch.tensor(3, dtype=torch.int64),
        "empty": torch.empty(2, 0),
    }
    save_file(tensors, tmp_path / "m.safetensors")
    with opened(tmp_path / "m.safetensors") as checkpoint:
        assert checkpoint.format == "safetensors"
        assert checkpoint.parts() == [checkpoint]
        records = {r.name: r for r in checkpoint.records()}
        for name, expected in tensors.items():
            assert records[name].dtype == str(expected.dtype).removeprefix("torch.")
            assert records[name].saved_device is None
            assert same(read_tensor(records[name], max_bytes=3), expected), name


def test_sharded_folder_reads_every_shard_and_offers_parts(tmp_path: Path) -> None:
    tensors = _sharded(tmp_path)
    assert load_all(tmp_path).keys() == tensors.keys()
    with opened(tmp_path) as checkpoint:
        assert checkpoint.format == "hf-sharded"
        assert checkpoint.findings == []
        parts = checkpoint.parts()
        assert len(parts) == 2

        def read_part(part: object) -> dict[str, torch.Tensor]:
            return {r.name: read_tensor(r, 8) for r in part.records()}  # type: ignore[attr-defined]

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(read_part, parts))
    merged = results[0] | results[1]
    for name, expected in tensors.items():
        assert same(merged[name], expected), name


def test_index_problems_become_findings(tmp_path: Path) -> None:
    _sharded(tmp_path, index_total=12345)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    del index["weight_map"]["head.bias"]
    index["weight_map"]["lost.weight"] = "model-00003-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    with opened(tmp_path) as checkpoint:
        found = {(f.kind, f.level, f.tensor) for f in checkpoint.findings}
        details = [f.detail for f in checkpoint.findings]
    assert ("missing-shard", "fail", None) in found
    assert ("index-mismatch", "fail", "ghost.weight") in found
    assert ("index-mismatch", "warn", "head.bias") in found
    assert not any(kind == "index-total-size" for kind, _, _ in found)  # a shard is missing: no total to compare
    assert any("model-00003-of-00003.safetensors missing" in d for d in details)


def test_index_total_size_mismatch(tmp_path: Path) -> None:
    _sharded(tmp_path, index_total=12345)
    with opened(tmp_path) as checkpoint:
        findings = [f for f in checkpoint.findings if f.kind == "index-total-size"]
    real = 4 * 3 * 4 + 6 * 2 + 2 * 2
    assert [f.detail for f in findings] == [f"index metadata.total_size 12345 != {real} bytes"]
    assert findings[0].level == "warn"


def test_pytorch_bin_shards(tmp_path: Path) -> None:
    first, second = {"a": torch.ones(2)}, {"b": torch.full((3,), 2.5, dtype=torch.float64)}
    torch.save(first, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save(second, tmp_path / "pytorch_model-00002-of-00002.bin")
    weight_map = {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = load_all(tmp_path)
    assert same(loaded["a"], first["a"])
    assert same(loaded["b"], second["b"])


def test_model_folder_with_one_checkpoint_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "README.md").write_text("# a model")
    weights = {"w": torch.tensor([1.0, 2.0])}
    torch.save(weights, tmp_path / "pytorch_model.bin")
    with opened(tmp_path) as checkpoint:
        assert checkpoint.format == "torch-zip"
        assert same(read_tensor(next(checkpoint.records())), weights["w"])


def test_distributed_checkpoint_folder(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import state_dict_saver

    state = {
        "model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.tensor([1, 2], dtype=torch.int32)},
        "optim": {"step": 7, "exp_avg_sq": torch.tensor([1e-8, 2e-9], dtype=torch.bfloat16)},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # single process, no process group: dcp warns and saves locally
        state_dict_saver.save(state, checkpoint_id=tmp_path)
    with opened(tmp_path) as checkpoint:
        assert checkpoint.format == "torch-dcp"
        records = {r.name: r for r in checkpoint.records()}
        assert {f.level for f in checkpoint.findings} == {"ok"}
    loaded = load_all(tmp_path)
    assert set(records) == {"model.w", "model.b", "optim.exp_avg_sq"}
    assert records["model.w"].shape == (3, 4)
    assert same(loaded["model.w"], state["model"]["w"])  # type: ignore[index]
    assert same(loaded["model.b"], state["model"]["b"])  # type: ignore[index]
    assert same(loaded["optim.exp_avg_sq"], state["optim"]["exp_avg_sq"])  # type: ignore[index]


def test_gguf_plain_and_quantized(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    f32 = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    f16 = np.array([[1.5, -65504.0]], dtype=np.float16)
    i32 = np.array([7, -9], dtype=np.int32)
    raw = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    q8 = gguf.quants.quantize(raw, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("f32", f32)
    writer.add_tensor("f16", f16)
    writer.add_tensor("i32", i32)
    writer.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with opened(path) as checkpoint:
        records = {r.name: r for r in checkpoint.records()}
        assert checkpoint.format == "gguf"
        assert [(f.kind, f.tensor) for f in checkpoint.findings] == [("gguf-quantized", "q8")]
        assert (records["f32"].dtype, records["f32"].shape) == ("float32", (3, 4))
        assert same(read_tensor(records["f32"], 8), torch.from_numpy(f32))
        assert same(read_tensor(records["f16"]), torch.from_numpy(f16))
        assert same(read_tensor(records["i32"]), torch.from_numpy(i32))
        expected = gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)
        assert records["q8"].shape == (2, 32)
        assert same(read_tensor(records["q8"], 64), torch.from_numpy(expected))
        assert float(np.abs(expected - raw).max()) < 0.01  # the reference dequantization is sane


def test_trainer_checkpoint_folder_prefixes_names_by_file(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    save_file(dict(model.state_dict()), tmp_path / "model.safetensors")
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # the same weights again: skipped
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    (tmp_path / "trainer_state.json").write_text("{}")
    loaded = load_all(tmp_path)
    with opened(tmp_path) as checkpoint:
        assert checkpoint.format == "folder"
        assert len(checkpoint.parts()) == 2
    state = optimizer.state_dict()["state"]
    assert sorted(loaded) == [
        "model.bias",
        "model.weight",
        "optimizer.state.0.exp_avg",
        "optimizer.state.0.exp_avg_sq",
        "optimizer.state.0.step",
        "optimizer.state.1.exp_avg",
        "optimizer.state.1.exp_avg_sq",
        "optimizer.state.1.step",
    ]
    assert same(loaded["optimizer.state.1.exp_avg_sq"], state[1]["exp_avg_sq"])
    assert same(loaded["model.weight"], model.weight.detach())


def test_open_checkpoint_accepts_str(tmp_path: Path) -> None:
    save_file({"a": torch.ones(1)}, tmp_path / "x.safetensors")
    checkpoint = open_checkpoint(str(tmp_path / "x.safetensors"))
    checkpoint.close()


def _write_two_rank_dcp(folder: Path, full: torch.Tensor, rows_per_rank: int, drop_last: bool = False) -> None:
    """A distributed checkpoint as two ranks write it: the tensor's rows split in two chunks, one file each.

    Written with torch's own metadata classes (trusted test code), so the loader sees exactly their pickle.
    """
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    chunks, storage = [], {}
    for rank, begin in enumerate(range(0, full.shape[0], rows_per_rank)):
        offsets = torch.Size([begin, 0])
        piece = full[begin : begin + rows_per_rank].clone()
        chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=piece.shape))
        if drop_last and begin + rows_per_rank >= full.shape[0]:
            chunks.pop()
            break
        data_file = folder / f"__{rank}_0.distcp"
        torch.save(piece, data_file)
        storage[MetadataIndex("w", offsets)] = _StorageInfo(data_file.name, 0, data_file.stat().st_size)
    tensor_meta = TensorStorageMetadata(TensorProperties(dtype=full.dtype), full.shape, list(reversed(chunks)))
    metadata = Metadata(state_dict_metadata={"w": tensor_meta}, storage_data=storage)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


def test_distributed_checkpoint_with_row_chunks_reads_in_order(tmp_path: Path) -> None:
    full = torch.arange(20, dtype=torch.float16).reshape(5, 4)
    _write_two_rank_dcp(tmp_path, full, rows_per_rank=3)
    with opened(tmp_path) as checkpoint:
        (record,) = list(checkpoint.records())
        assert (record.name, record.dtype, record.shape, record.nbytes) == ("w", "float16", (5, 4), 40)
        assert same(read_tensor(record, max_bytes=6), full)
        assert not [f for f in checkpoint.findings if f.level != "ok"]


def test_distributed_checkpoint_missing_a_chunk_is_a_finding(tmp_path: Path) -> None:
    _write_two_rank_dcp(tmp_path, torch.ones(4, 2), rows_per_rank=2, drop_last=True)
    with opened(tmp_path) as checkpoint:
        problems = [(f.kind, f.level, f.detail, f.tensor) for f in checkpoint.findings if f.level != "ok"]
    assert problems == [("dcp-chunks", "fail", "chunks hold 4 of 8 elements", "w")]


def test_folder_reports_a_checkpoint_named_file_it_cannot_read(tmp_path: Path) -> None:
    save_file({"w": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "broken.safetensors").write_bytes((tmp_path / "model.safetensors").read_bytes()[:20])
    (tmp_path / "notes.txt").write_text("not a checkpoint and not named like one")
    checkpoint = open_checkpoint(str(tmp_path))
    try:
        assert [r.name for r in checkpoint.records()] == ["w"]
        assert [(f.kind, f.level) for f in checkpoint.findings] == [("unreadable-file", "warn")]
        assert checkpoint.findings[0].detail.startswith("broken.safetensors: named like a checkpoint")
    finally:
        checkpoint.close()


def _plain_zip(path: Path) -> None:
    """A zip named like a checkpoint that is none (no ``data.pkl``, no torch.package ``extern_modules``)."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/notes.txt", "not a checkpoint")


NOT_READ = "model.pt: zip archive is not a torch checkpoint (no data.pkl) (skipped)"


def test_a_folder_is_judged_file_by_file(tmp_path: Path, cli) -> None:
    # One .pt of the folder is a zip of no format dtypecheck reads: that file is an unreadable-file warning, the
    # rest scanned.
    _plain_zip(tmp_path / "model.pt")
    torch.save({"w": torch.tensor([1.0, 2.0, 3.0])}, tmp_path / "optimizer.pt")
    result = cli("scan-model", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert [t["name"] for t in doc["tensors"]] == ["optimizer.w"]  # (named as beside a readable model.pt)
    assert [(f["kind"], f["level"], f["detail"]) for f in doc["findings"] if f["level"] != "ok"] == [
        ("unreadable-file", "warn", NOT_READ)
    ]
    assert doc["summary"]["level"] == "warn"


def test_a_folder_of_only_an_unreadable_file_has_no_tensors(tmp_path: Path, cli) -> None:
    _plain_zip(tmp_path / "model.pt")
    result = cli("scan-model", str(tmp_path), "--format", "json")
    assert result.exit_code == 1  # no-tensors (fail), not an input error of the whole folder
    kinds = [(f["kind"], f["level"]) for f in result.json()["findings"] if f["level"] != "ok"]
    assert kinds == [("no-tensors", "fail"), ("unreadable-file", "warn")]


def test_an_unreadable_file_alone_is_still_an_input_error(tmp_path: Path, cli) -> None:
    _plain_zip(tmp_path / "model.pt")
    result = cli("scan-model", str(tmp_path / "model.pt"))
    assert result.exit_code == 3
    assert result.stderr == f"error: {tmp_path / 'model.pt'}: {NOT_READ.removeprefix('model.pt: ')[:-10]}\n"


def test_a_torch_package_in_a_folder_is_read(tmp_path: Path, cli) -> None:
    from torch.package.package_exporter import PackageExporter

    with warnings.catch_warnings(), PackageExporter(str(tmp_path / "model.pt")) as exporter:
        warnings.simplefilter("ignore")  # (torch.package pickles TypedStorage, which torch deprecates)
        exporter.extern("torch.**")
        exporter.save_pickle("model", "state.pkl", {"w": torch.tensor([1.0, -2.0])})
    torch.save({"w": torch.tensor([1.0, 2.0, 3.0])}, tmp_path / "optimizer.pt")
    result = cli("scan-model", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert {t["name"]: t["min"] for t in doc["tensors"]} == {"model.w": -2.0, "optimizer.w": 1.0}
    assert [f for f in doc["findings"] if f["level"] != "ok"] == []


def test_a_refused_file_in_a_folder_still_stops_the_scan(tmp_path: Path, cli) -> None:
    # Truncated, hostile or refused files are not "some other format": the folder's scan ends as the file's would.
    import zipfile

    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    with zipfile.ZipFile(tmp_path / "second.pt", "w") as archive:
        archive.writestr("a/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("b/stray", b"")
    result = cli("scan-model", str(tmp_path))
    assert result.exit_code == 3
    assert "torch refuses it" in result.stderr


def _sentence_folder(folder: Path, modules: list[object]) -> None:
    """A sentence-transformers folder as ``SentenceTransformer.save`` lays it out: the root model's weights at the
    top, each further module's in its own subfolder, ``modules.json`` naming them."""
    save_file({"embeddings.weight": torch.ones(4, 2)}, folder / "model.safetensors")
    (folder / "modules.json").write_text(json.dumps(modules))


def test_a_sentence_transformers_modules_weights_are_read_beside_the_root_model(tmp_path: Path) -> None:
    dense = {"linear.weight": torch.tensor([[1.0, float("nan")], [7e4, 2.0]]), "linear.bias": torch.zeros(2)}
    _sentence_folder(
        tmp_path,
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        ],
    )
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 2}')
    (tmp_path / "2_Dense").mkdir()
    save_file(dense, tmp_path / "2_Dense" / "model.safetensors")
    torch.save(dense, tmp_path / "2_Dense" / "pytorch_model.bin")  # the twin a 2.x save also wrote: judged, not read
    loaded = load_all(tmp_path)
    assert sorted(loaded) == ["2_Dense/model.linear.bias", "2_Dense/model.linear.weight", "embeddings.weight"]
    assert same(loaded["2_Dense/model.linear.weight"], dense["linear.weight"])


def test_a_module_path_outside_the_folder_or_missing_reads_nothing_more(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    save_file({"w": torch.ones(1)}, outside / "model.safetensors")
    model = tmp_path / "model"
    model.mkdir()
    (model / "linked").symlink_to(outside)
    _sentence_folder(
        model,
        [
            {"path": "", "type": "sentence_transformers.models.Transformer"},
            {"path": "../elsewhere", "type": "sentence_transformers.models.Dense"},
            {"path": "linked", "type": "sentence_transformers.models.Dense"},
            {"path": "3_Missing", "type": "sentence_transformers.models.Dense"},
            {"path": 7},
            "not a module",
        ],
    )
    assert sorted(load_all(model)) == ["embeddings.weight"]
    (model / "modules.json").write_text("[{")  # malformed: the library cannot load it, and no module is read
    assert sorted(load_all(model)) == ["embeddings.weight"]


def test_a_nan_in_a_saved_sentence_transformers_dense_layer_fails_the_gate(tmp_path: Path, cli) -> None:
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    base = tmp_path / "bert"
    config = BertConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    config.vocab_size = 16
    BertModel(config).save_pretrained(base)
    (base / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijk"]))
    BertTokenizerFast(str(base / "vocab.txt")).save_pretrained(base)
    dense = Dense(8, 4)
    with torch.no_grad():
        dense.linear.weight[0, 0] = float("nan")
        dense.linear.weight[1, 1] = 1e6  # past float16's 65504
    model = SentenceTransformer(modules=[Transformer(str(base)), Pooling(8), dense])
    model.save(str(tmp_path / "saved"))
    result = cli("scan-model", str(tmp_path / "saved"), "--target", "fp16", "-f", "json", "-q")
    assert result.exit_code == 1, result.stderr
    document = json.loads(result.stdout)
    (row,) = [t for t in document["tensors"] if t["name"] == "2_Dense/model.linear.weight"]
    weight = dense.linear.weight.detach().numpy()
    assert row["nan"] == int(np.isnan(weight).sum()) == 1
    assert row["casts"]["float16"]["overflow"] == int((np.abs(weight[np.isfinite(weight)]) > 65504).sum()) == 1


def test_a_routers_routes_are_read_from_the_subfolders_its_config_names(tmp_path: Path) -> None:
    # Router.save (sentence-transformers >= 5) writes each route's module in a subfolder of its own folder.
    _sentence_folder(
        tmp_path,
        [{"path": ""}, {"path": "2_Router", "type": "sentence_transformers.base.modules.router.Router"}],
    )
    router = tmp_path / "2_Router"
    for route in ("query_0_Dense", "document_0_Dense", "unnamed_0_Dense"):
        (router / route).mkdir(parents=True)
        save_file({"linear.weight": torch.full((1, 1), float(len(route)))}, router / route / "model.safetensors")
    types = {"query_0_Dense": "x", "document_0_Dense": "x", "../escape": "x", "": "x"}
    (router / "router_config.json").write_text(json.dumps({"types": types}))
    loaded = load_all(tmp_path)
    assert sorted(loaded) == [
        "2_Router/document_0_Dense/model.linear.weight",
        "2_Router/query_0_Dense/model.linear.weight",
        "embeddings.weight",
    ]
    assert loaded["2_Router/query_0_Dense/model.linear.weight"].item() == len("query_0_Dense")


def test_a_truncated_module_weights_file_is_named_not_dropped(tmp_path: Path) -> None:
    root = {"path": "", "type": "sentence_transformers.models.Transformer"}
    _sentence_folder(tmp_path, [root, {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}])
    (tmp_path / "2_Dense").mkdir()
    save_file({"linear.weight": torch.ones(2, 2)}, tmp_path / "2_Dense" / "model.safetensors")
    whole = (tmp_path / "2_Dense" / "model.safetensors").read_bytes()
    (tmp_path / "2_Dense" / "model.safetensors").write_bytes(whole[:40])
    with opened(tmp_path) as checkpoint:
        assert [record.name for record in checkpoint.records()] == ["embeddings.weight"]
        assert [(f.kind, f.level, f.detail) for f in checkpoint.findings] == [
            (
                "unreadable-file",
                "warn",
                "2_Dense/model.safetensors: named like a checkpoint, but its content is not one (skipped)",
            )
        ]
