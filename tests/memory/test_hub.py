"""``estimate-memory org/name[@rev]`` (issue 22.5): the config.json from the local Hugging Face cache, offline,
as scan-model resolves Hub ids; the cache is built by hand in huggingface_hub's layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.memory._fixtures import DECODER

pytest.importorskip("huggingface_hub")
COMMIT = "c" * 40


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "hf-cache"
    storage = folder / "models--org--tiny-decoder"
    snapshot = storage / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(DECODER), encoding="utf-8")
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return folder


def test_a_cached_hub_config_is_estimated_offline_like_the_file(cli, cache, tmp_path):
    by_id = cli("estimate-memory", "org/tiny-decoder", "-d", "fp32", "-f", "json")
    assert by_id.exit_code == 0, by_id.stderr
    by_commit = cli("estimate-memory", f"org/tiny-decoder@{COMMIT}", "-d", "fp32", "-f", "json").json()
    local = tmp_path / "local"
    local.mkdir()
    (local / "config.json").write_text(json.dumps(DECODER), encoding="utf-8")
    by_file = cli("estimate-memory", str(local), "-d", "fp32", "-f", "json").json()
    assert by_id.json()["estimates"] == by_commit["estimates"] == by_file["estimates"]
    assert by_id.json()["model"]["source"].endswith(f"snapshots/{COMMIT}/config.json")


def test_a_hub_id_not_cached_while_offline_is_one_error_line(cli, cache):
    result = cli("estimate-memory", "org/missing-model")
    assert result.exit_code == 3
    assert result.stderr.startswith("error: org/missing-model: no such file or directory, and as a Hub id its ")
    assert len(result.stderr.strip().splitlines()) == 1
