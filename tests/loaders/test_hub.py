"""Hub ids ``org/name[@revision]`` resolve through huggingface_hub's cache; nothing is downloaded in these tests.

The cache is built by hand in tmp_path in huggingface_hub's layout: ``models--org--name/refs/<branch>`` holding a
commit hash, ``snapshots/<hash>/<file>`` symlinks to ``blobs/<sha256>``.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.errors import InputError
from dtypecheck.loaders import hub, open_checkpoint
from tests._ckpt_factory import load_all, same

MAIN = "a" * 40
V1 = "b" * 40


def _cache_model(cache: Path, repo: str, commit: str, tensors: dict[str, torch.Tensor], ref: str | None) -> Path:
    storage = cache / ("models--" + repo.replace("/", "--"))
    built = storage / "tmp.safetensors"
    built.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(built))
    data = built.read_bytes()
    built.unlink()
    blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(Path("..", "..", "blobs", blob.name))
    (snapshot / "config.json").write_text('{"model_type": "tiny"}')
    if ref is not None:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "hf-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return folder


TINY = {"embed.weight": torch.tensor([[1.0, -2.0], [65536.0, 0.5]])}
TINY_V1 = {"embed.weight": torch.tensor([[0.25, 0.125]])}


def test_a_cached_model_is_scanned_offline(cli, cache: Path) -> None:
    snapshot = _cache_model(cache, "org/tiny", MAIN, TINY, "main")
    assert hub.resolve_hub_id("org/tiny") == snapshot
    tensors = load_all("org/tiny")
    assert list(tensors) == ["embed.weight"]
    assert same(tensors["embed.weight"], TINY["embed.weight"])
    result = cli("scan-model", "org/tiny", "--format", "json")
    assert result.exit_code == 1  # 65536 overflows float16 (max 65504)
    doc = result.json()
    assert doc["format"] == "safetensors"
    assert doc["tensors"][0]["casts"]["float16"]["overflow"] == 1


def test_revisions_by_branch_and_by_commit(cache: Path) -> None:
    _cache_model(cache, "org/tiny", MAIN, TINY, "main")
    v1 = _cache_model(cache, "org/tiny", V1, TINY_V1, "v1")
    assert hub.resolve_hub_id("org/tiny@v1") == v1
    assert hub.resolve_hub_id(f"org/tiny@{V1}") == v1
    assert same(load_all("org/tiny@v1")["embed.weight"], TINY_V1["embed.weight"])


def test_not_cached_while_offline_is_one_input_error_line(cli, cache: Path) -> None:
    result = cli("scan-model", "org/absent")
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: org/absent: no such file or directory, and as a Hub id it is not in the local")
    assert "HF_HUB_OFFLINE" in lines[0]
    assert str(cache) in lines[0]
    _cache_model(cache, "org/tiny", MAIN, TINY, "main")
    assert cli("scan-model", "org/tiny@nope").exit_code == 3  # a revision never cached


def test_a_local_path_wins_over_a_hub_id(cache: Path) -> None:
    _cache_model(cache, "org/tiny", MAIN, TINY, "main")
    local = Path("org/tiny")  # relative to the test's working directory
    local.mkdir(parents=True)
    save_file(TINY_V1, str(local / "model.safetensors"))
    assert hub.resolve_hub_id("org/tiny") is None
    assert same(load_all("org/tiny")["embed.weight"], TINY_V1["embed.weight"])


def test_paths_that_are_not_hub_ids(cache: Path) -> None:
    for target in ("org/model.safetensors", "ckpt/model.pt", "a/b/c", "/abs/path", "name", "org/x@"):
        assert hub.parse_hub_id(target) is None, target
    assert hub.parse_hub_id("Qwen/Qwen2.5-0.5B@refs/pr/1") == ("Qwen/Qwen2.5-0.5B", "refs/pr/1")
    with pytest.raises(InputError, match=r"^no such file or directory: ckpt/model\.pt$"):
        open_checkpoint("ckpt/model.pt")


def test_without_huggingface_hub_a_hub_id_is_an_input_error(cli, cache: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import now raises ImportError
    result = cli("scan-model", "org/tiny")
    assert result.exit_code == 3
    assert "pip install 'dtypecheck[hf]'" in result.stderr


def test_online_downloads_only_the_weight_files(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The download path, with huggingface_hub's network calls replaced by fakes."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls: list[dict[str, object]] = []
    listing = ["config.json", "model.safetensors", "pytorch_model.bin", "onnx/model.safetensors", "README.md"]

    class FakeApi:
        def list_repo_files(self, repo_id: str, revision: str | None = None) -> list[str]:
            assert (repo_id, revision) == ("org/remote", "v2")
            return listing

    def fake_snapshot_download(repo_id: str, **kwargs: object) -> str:
        calls.append(kwargs)
        if kwargs.get("local_files_only"):
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        return str(_cache_model(cache, repo_id, MAIN, TINY, None))

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    folder = hub.resolve_hub_id("org/remote@v2")
    assert folder is not None
    assert (folder / "model.safetensors").is_file()
    assert [c.get("allow_patterns") for c in calls] == [None, ["model.safetensors"]]
    assert hub.weight_files(["a/b.bin", "pytorch_model-1.bin", "pytorch_model.bin.index.json", "x.txt"]) == [
        "pytorch_model-1.bin",
        "pytorch_model.bin.index.json",
    ]


def test_a_cache_ref_that_is_a_fifo_is_refused(cli, cache: Path) -> None:
    import os

    snapshot = _cache_model(cache, "org/tiny", MAIN, TINY, None)
    refs = snapshot.parents[1] / "refs"
    refs.mkdir()
    os.mkfifo(refs / "main")  # huggingface_hub would block reading it
    result = cli("scan-model", "org/tiny")
    assert result.exit_code == 3
    assert result.stderr == f"error: {refs / 'main'}: a FIFO, not a regular file: refused before reading\n"


@pytest.mark.parametrize("command", ["scan-model", "estimate-memory"])
def test_an_uncached_hub_id_offline_with_the_default_cache_is_one_line(tmp_path: Path, command: str) -> None:
    # A fresh process with no HF_HUB_CACHE/HF_HOME: huggingface_hub's default cache comes from its constants
    # submodule, which `import huggingface_hub` does not load (an AttributeError traceback before the fix).
    import subprocess

    from tests.nantrace._scripts import subprocess_env

    env = {k: v for k, v in subprocess_env().items() if k not in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}
    env.update(HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-m", "dtypecheck", command, "org/not-cached"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("error: org/not-cached: no such file or directory, and as a Hub id")
    assert done.stderr.count("\n") == 1
    if command == "scan-model":  # it names the cache it looked in: the default under this HOME
        assert str(tmp_path / ".cache" / "huggingface" / "hub") in done.stderr
