"""Issue 27, class 3: nothing shipped with the checkpoint governs its own scan (``tests/security/gate/shipped_config``).

Every input runs through the real command line in this process, from its victim's working folder; the payloads'
canaries must not exist after the scans, and each payload is then proven live under ``torch.load``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.security.corpus import Hostile
from tests.security.gate import shipped_config
from tests.security.harness import prove_live


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Hostile]:
    return {h.name: h for h in shipped_config.build(tmp_path_factory.mktemp("shipped"))}


def _run(cli: Callable[..., CliResult], hostile: Hostile, monkeypatch: pytest.MonkeyPatch, *extra: str) -> CliResult:
    assert hostile.cwd is not None
    monkeypatch.chdir(hostile.cwd)
    return cli(*hostile.args, *extra)


def test_every_input_exits_as_the_contract_says_and_runs_no_payload(
    cli: Callable[..., CliResult], corpus: dict[str, Hostile], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(corpus) == 17
    wrong = {}
    for hostile in corpus.values():
        result = _run(cli, hostile, monkeypatch, "--quiet")
        if result.exit_code not in hostile.expect:
            wrong[hostile.name] = (result.exit_code, result.stderr[-300:])
    assert wrong == {}
    assert [h.name for h in corpus.values() if h.canary is not None and h.canary.exists()] == []
    payloads = [h for h in corpus.values() if h.loader != "none"]
    assert len(payloads) == 4
    # the proof reads the files themselves; their working folder does not matter to torch.load
    assert prove_live([dataclasses.replace(h, cwd=None) for h in payloads]) == {h.name for h in payloads}


def test_a_shipped_config_is_named_in_a_note_and_not_read(
    cli: Callable[..., CliResult], corpus: dict[str, Hostile], monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = corpus["shipped-ignore-folder"]
    result = _run(cli, hostile, monkeypatch, "--format", "json")
    assert result.exit_code == 1
    shipped = Path(hostile.args[1]) / "pyproject.toml"
    assert result.stderr == (
        f"note: not reading {shipped}: it came with a checkpoint, and nothing shipped with a checkpoint governs its "
        "scan (configuration comes from the working folder's project or --config)\n"
    )
    document = result.json()
    assert document["targets"] == ["float16", "bfloat16"]  # not the shipped file's ["float16"]
    assert [(t["name"], t["nan"], t["level"], t["policy"]) for t in document["tensors"]] == [("w", 1, "fail", [])]
    dotfiles = _run(cli, corpus["shipped-dotfile-ignore"], monkeypatch)
    folder = Path(corpus["shipped-dotfile-ignore"].args[1])
    assert [line.split(":")[1].split(" ")[-1] for line in dotfiles.stderr.splitlines() if "note" in line] == [
        str(folder / ".dtypecheck.toml"),
        str(folder / "dtypecheck.toml"),
    ]


def test_the_projects_own_fail_on_warn_holds_against_a_nearer_empty_table(
    cli: Callable[..., CliResult], corpus: dict[str, Hostile], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(cli, corpus["shipped-empty-table-drops-fail-on-warn"], monkeypatch, "--format", "json", "-q")
    assert result.exit_code == 1
    (tensor,) = result.json()["tensors"]
    # 1e-10 is below float16's smallest subnormal 2**-24 / 2 = 2.98e-8: it flushes to zero (a warning), and
    # bfloat16 (float32's exponent range) keeps it.
    assert (tensor["casts"]["float16"]["underflow"], tensor["casts"]["bfloat16"]["underflow"]) == (1, 0)
    assert tensor["level"] == "warn"


def test_a_recorded_security_finding_is_new_against_any_baseline(
    cli: Callable[..., CliResult], corpus: dict[str, Hostile], monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = corpus["baseline-flag-accepts-system"]
    result = _run(cli, hostile, monkeypatch, "--format", "json", "-q")
    assert result.exit_code == 1
    baseline = json.loads(Path(hostile.args[hostile.args.index("--baseline") + 1]).read_text())
    recorded = [f for f in baseline["findings"] if f["kind"] == "pickle-global" and f["level"] == "fail"]
    assert len(recorded) == 1  # the baseline did record the global (and the inert torch ones, at ok)
    assert "posix.system" in recorded[0]["detail"]
    states = {(c["check"], c["state"]) for c in result.json()["baseline"]["changes"]}
    assert (f"finding:pickle-global:{recorded[0]['detail']}", "new") in states
    assert result.json()["baseline"]["level"] == "fail"


def test_update_baseline_writes_the_entry_and_still_gates_on_the_payload(
    cli: Callable[..., CliResult], corpus: dict[str, Hostile], monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = corpus["update-baseline-accepts-system"]
    assert _run(cli, hostile, monkeypatch, "-q").exit_code == 1
    assert hostile.cwd is not None
    written = json.loads((hostile.cwd / "baseline.json").read_text())
    assert list(written["checkpoints"]) == ["../downloads/model/model.pt"]
    assert _run(cli, dataclasses.replace(hostile, args=hostile.args[:-1]), monkeypatch, "-q").exit_code == 1


def test_ignore_rules_never_touch_findings(
    cli: Callable[..., CliResult], corpus: dict[str, Hostile], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(cli, corpus["ignore-rule-accepts-system"], monkeypatch, "--format", "json", "-q")
    assert result.exit_code == 1
    document = result.json()
    assert [t["policy"] for t in document["tensors"]] == [[]]  # nothing to ignore in w = 1.0
    failing = [f["detail"] for f in document["findings"] if f["kind"] == "pickle-global" and f["level"] == "fail"]
    assert len(failing) == 1
    assert "posix.system" in failing[0]
