"""scan-model split across ranks (``torchrun ... -m dtypecheck scan-model DIR``): one report, a single process's.

The in-process tests run rank 1 and then rank 0 against a dict store; the subprocess ones launch two real ranks,
bounded by a timeout far below anything that could pass by waiting.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import lookup
from dtypecheck.errors import ExitCode
from dtypecheck.nantrace.launch import free_port
from dtypecheck.render.json import render_json
from dtypecheck.scan import run as scan_run
from dtypecheck.scan.ranks import RankError, Ranks, split_by_bytes
from dtypecheck.scan.run import scan_checkpoint, scan_share
from tests.nantrace._ranks import torchrun
from tests.nantrace._scripts import subprocess_env

TIMEOUT_S = 240
SHARDS = ("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors")


class DictStore:
    """The store's three calls, in memory."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes:
        return self.values[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.values for k in keys)


def _sharded(folder: Path, findings: bool = True) -> Path:
    """Three shards of 8400 + 40 float32 bytes, 200 + 20 bytes (bfloat16 + float32), 12 bytes: with 2 ranks the
    first goes to rank 0 and the other two to rank 1."""
    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    big = torch.randn(300, 7, generator=generator) * (1e5 if findings else 1.0)
    shards = [
        {"a": big, "b": torch.randn(10, generator=generator)},
        {"c": torch.randn(100, generator=generator).to(torch.bfloat16), "e": torch.randn(5, generator=generator)},
        {"d": torch.tensor([1e-30, float("nan"), 7e4]) if findings else torch.tensor([1.0, 2.0, 3.0])},
    ]
    weight_map: dict[str, str] = {}
    for name, shard in zip(SHARDS, shards, strict=True):
        save_file(shard, folder / name)
        weight_map |= dict.fromkeys(shard, name)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize(
    ("sizes", "world_size", "expected"),
    [
        ([8440, 220, 12], 2, [0, 1, 1]),
        ([5, 5, 5, 5], 2, [0, 1, 0, 1]),
        ([10, 1, 1, 9], 3, [0, 2, 2, 1]),  # 10 -> r0, 9 -> r1, then r2 (0 bytes) twice: loads 10, 9, 2
        ([7], 4, [0]),
        ([], 2, []),
    ],
)
def test_parts_are_dealt_by_bytes_largest_first(sizes: list[int], world_size: int, expected: list[int]) -> None:
    assert split_by_bytes(sizes, world_size) == expected


def test_two_ranks_give_the_single_process_report(tmp_path: Path) -> None:
    folder = _sharded(tmp_path / "ckpt")
    targets = [lookup("float16"), lookup("float8_e4m3fn")]
    single = scan_checkpoint(str(folder), targets, precision=True)
    store = DictStore()
    assert scan_share(str(folder), Ranks(1, 2, store, "p/"), targets, precision=True) is None
    published = pickle.loads(store.values["p/result/1"])
    assert sorted(scan.name for scan in published.values()) == ["c", "d", "e"]  # the two small shards
    merged = scan_checkpoint(str(folder), targets, precision=True, ranks=Ranks(0, 2, store, "p/"))
    assert render_json(merged) == render_json(single)
    assert (merged.summary.level, merged.summary.tensors) == ("fail", 5)


def test_a_rank_that_cannot_read_its_shard_fails_the_scan_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _sharded(tmp_path / "ckpt")
    shard = folder / SHARDS[1]
    whole = shard.read_bytes()
    from dtypecheck.loaders import open_checkpoint as opened

    def open_then_truncate(checkpoint: str) -> Any:  # the file shrinks between the listing and the reads
        result = opened(checkpoint)
        shard.write_bytes(whole[: len(whole) - 100])
        return result

    monkeypatch.setattr(scan_run, "open_checkpoint", open_then_truncate)
    store = DictStore()
    stopped = scan_share(str(folder), Ranks(1, 2, store, "p/"))
    assert stopped is not None
    code, message = stopped
    assert code == ExitCode.INPUT_ERROR
    assert str(shard) in message
    monkeypatch.undo()
    shard.write_bytes(whole)
    with pytest.raises(RankError) as raised:
        scan_checkpoint(str(folder), ranks=Ranks(0, 2, store, "p/"))
    assert (raised.value.exit_code, raised.value.message()) == (ExitCode.INPUT_ERROR, message)


def test_rank_0_stops_waiting_for_a_silent_rank() -> None:
    with pytest.raises(RankError, match=r"rank\(s\) 1 sent no scan results within 0.2 s"):
        Ranks(0, 2, DictStore(), "p/").gather(wait_s=0.2)


def _launch(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return torchrun("scan-model", str(folder), "--format", "json", *args)


def _single(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dtypecheck", "scan-model", str(folder), "--format", "json", *args]
    return subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=TIMEOUT_S, check=False)


def test_torchrun_writes_the_single_process_document(tmp_path: Path) -> None:
    folder = _sharded(tmp_path / "ckpt")
    alone = _single(folder, "-t", "fp16,e4m3")
    together = _launch(folder, "-t", "fp16,e4m3")
    assert alone.returncode == together.returncode == 1, together.stderr
    assert together.stdout == alone.stdout  # rank 0's stdout: the document; the other rank writes nothing
    assert json.loads(together.stdout)["summary"]["tensors"] == 5


def test_ranks_under_their_own_launcher_exit_as_a_single_process(tmp_path: Path) -> None:
    """torchrun turns any failing rank into its own exit 1; the ranks themselves keep the contract's codes."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    folder = _sharded(tmp_path / "ckpt", findings=False)
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in [*SHARDS, "model.safetensors.index.json"]:
        (broken / name).write_bytes((folder / name).read_bytes())
    (broken / SHARDS[1]).write_bytes((folder / SHARDS[1]).read_bytes()[:-100])
    for checkpoint, expected in [(folder, ExitCode.OK), (broken, ExitCode.INPUT_ERROR)]:
        port = free_port()
        store = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
        ranks = []
        for rank in (0, 1):
            environ = {**subprocess_env(), "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_PORT": str(port)}
            environ |= {"MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_RUN_ID": f"test-{expected}"}
            command = [sys.executable, "-m", "dtypecheck", "scan-model", str(checkpoint), "--format", "json"]
            ranks.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ))
        outputs = [process.communicate(timeout=TIMEOUT_S) for process in ranks]
        del store
        alone = _single(checkpoint)
        assert (ranks[0].returncode, ranks[1].returncode) == (alone.returncode, 0) == (expected, 0)
        assert outputs[0][0].decode() == alone.stdout
        assert outputs[1] == (b"", b"")  # rank 1 says nothing: rank 0 reports once for the run
        assert outputs[0][1].decode() == alone.stderr
        if expected == ExitCode.INPUT_ERROR:
            assert alone.stderr.startswith("error: ")
            assert SHARDS[1] in alone.stderr
