"""A tiny pickle that calls an allowed callable with a size (``tests/security/gate/sized_calls.py``, the
``sized-calls`` corpus class): each payload is live under a memory cap and the gate fails it; whole models,
optimizers, schedulers, Lightning dicts, small calls of the same callables and ``TrainingArguments`` as
``torch.save`` writes them pass."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dtypecheck.loaders._io.pickle_globals import judge
from dtypecheck.loaders._io.pickle_vm import unpickle
from tests.conftest import CliResult
from tests.security import corpus
from tests.security.gate import sized_calls
from tests.security.harness import assert_cli_fails_each_in_its_own_process, exhausts_each, payload_scans, prove_live

CALLS = sized_calls.calls()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, corpus.Hostile]:
    return {h.name: h for h in corpus.build(tmp_path_factory.mktemp("sized"), (sized_calls.KLASS,))}


@pytest.fixture(scope="module")
def capped_loads(inputs: dict[str, corpus.Hostile]) -> dict[str, tuple[bool, str]]:
    """Each payload's capped ``torch.load`` (``harness.exhausts_each``: a process, cap and memory of its own, forked
    from one that imported torch once for them all): name -> (exhausted, what the proof printed)."""
    paths = [inputs[name].torch_load for name in sorted(CALLS)]
    assert all(path is not None for path in paths)
    return dict(zip(sorted(CALLS), exhausts_each([path for path in paths if path is not None]), strict=True))


@pytest.mark.parametrize("name", sorted(CALLS))
def test_payload_is_live_under_a_memory_cap(
    name: str, inputs: dict[str, corpus.Hostile], capped_loads: dict[str, tuple[bool, str]]
) -> None:
    """torch.load of the checkpoint runs out of a 2 GiB cap (or past 20 s), and the corpus' proof says so."""
    hostile = inputs[name]
    assert hostile.torch_load is not None
    exhausted, printed = capped_loads[name]
    assert exhausted, printed
    assert hostile.canary is not None
    hostile.canary.touch()  # what prove_live makes of it, without loading it twice
    assert hostile.loader == sized_calls.CAPPED


def test_the_corpus_proof_makes_no_canary_for_what_loads(inputs: dict[str, corpus.Hostile], tmp_path: Path) -> None:
    """The capped proof of a file that loads (a benign save given a canary here) leaves no canary."""
    benign = inputs["small-calls"]
    loads = Path(benign.args[1])
    probe = corpus.Hostile(
        "probe", sized_calls.KLASS, benign.args, frozenset({1}), tmp_path / "c", loads, loader=sized_calls.CAPPED
    )
    assert prove_live([probe]) == set()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_gate_fails_a_sized_call(name: str, inputs: dict[str, corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    ((_, result),) = payload_scans([inputs[name]], cli)
    assert result.json()["summary"]["level"] == "fail"
    _, refs = unpickle(_data_pkl(CALLS[name]), where=name, persistent_load=lambda pid: ("storage", pid))
    assert "fail" in {judge(ref)[0] for ref in refs}


def test_the_cli_fails_them_in_a_process_of_its_own(inputs: dict[str, corpus.Hostile]) -> None:
    """As CI runs it: all six in one fresh process (a process per payload cost ~2 s each)."""
    assert_cli_fails_each_in_its_own_process([inputs[name] for name in sorted(CALLS)])


def test_small_calls_of_the_same_callables_stay_allowed() -> None:
    for small in sized_calls.small_calls():
        _, refs = unpickle(_data_pkl(small), where="small", persistent_load=lambda pid: ("storage", pid))
        assert {judge(ref)[0] for ref in refs} == {"ok"}


def _data_pkl(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    archive = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    return archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))


@pytest.mark.parametrize("name", sorted(sized_calls.whole_saves()))
def test_whole_saves_never_call_with_a_size(name: str) -> None:
    value = sized_calls.whole_saves()[name]
    _, refs = unpickle(_data_pkl(value), where=name, persistent_load=lambda pid: ("storage", pid))
    assert {judge(ref)[0] for ref in refs} == {"ok"}, [(r.qualname, sorted(r.uses)) for r in refs]


def test_benign_counterparts_pass_the_gate(inputs: dict[str, corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    benign = [h for h in inputs.values() if h.benign]
    assert {h.name for h in benign} == {f"whole-{n}" for n in sized_calls.whole_saves()} | {"small-calls"}
    for hostile in benign:
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 0, (hostile.name, result.stderr, result.json()["findings"])


def test_training_arguments_stay_a_warning(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    _, refs = unpickle(_data_pkl(args), where="training_args.bin", persistent_load=lambda pid: ("storage", pid))
    assert {judge(ref)[0] for ref in refs} <= {"ok", "warn"}


def test_sized_calls_class_is_registered() -> None:
    assert sized_calls.KLASS in corpus.GATE_CLASSES
