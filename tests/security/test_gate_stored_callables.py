"""Red team, round 5: a torch or numpy name the pickle only stores, where torch's own code then calls it
(``Optimizer.__setstate__``'s ``self.state.get``, ``ModuleDict.__setitem__``'s ``self.add_module``), fails the
gate; each payload is live under ``torch.load``, and whole optimizers, schedulers and layers still pass."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import CliResult
from tests.security import corpus
from tests.security.gate import stored_callables
from tests.security.harness import assert_cli_fails_each_in_its_own_process, payload_scans, prove_live

# name -> the global that must be reported ``fail`` for it (every other global of these files is ok)
EXPECTED_FAIL = {
    "optimizer-state-get": "numpy.savetxt",
    "optimizer-state-module-getattr": "numpy.savetxt",
    "optimizer-state-torch-class": "torch.package.package_exporter.PackageExporter",
    "moduledict-setitems-add-module": "numpy.savetxt",
}
BENIGN = {"whole-optimizer", "whole-scheduler", "transformer-layer-gelu", "hparams-scalar-type-and-activation"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[corpus.Hostile]:
    return corpus.build(tmp_path_factory.mktemp("stored"), (stored_callables.KLASS,))


def _levels(result: CliResult) -> dict[str, str]:
    return {f["detail"]: f["level"] for f in result.json()["findings"] if f["kind"] == "pickle-global"}


EXTRA_FAIL = {"moduledict-setitems-add-module": ["torch.nn.modules.container.ModuleDict"]}
"""Globals that fail besides the expected one: a module class given ``SETITEMS`` (its ``__setitem__`` runs), which
``torch.save`` never writes (it ``BUILD``s a module's ``__dict__``)."""


def test_every_payload_fails_the_gate(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    assert {h.name for h in inputs if not h.benign} == set(EXPECTED_FAIL)
    for hostile, result in payload_scans(inputs, cli):
        levels = _levels(result)
        assert levels[EXPECTED_FAIL[hostile.name]] == "fail", (hostile.name, levels)
        extra = EXTRA_FAIL.get(hostile.name, [])
        assert [name for name, level in levels.items() if level == "fail"] == [*extra, EXPECTED_FAIL[hostile.name]]


def test_every_payload_is_live(inputs: list[corpus.Hostile]) -> None:
    assert prove_live(inputs) == set(EXPECTED_FAIL)


def test_the_cli_fails_them_in_a_process_of_its_own(inputs: list[corpus.Hostile]) -> None:
    assert_cli_fails_each_in_its_own_process(inputs)


def test_whole_objects_still_pass(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    assert {h.name for h in inputs if h.benign} == BENIGN
    for hostile in (h for h in inputs if h.benign):
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 0, (hostile.name, result.stderr, result.json()["findings"])
        assert "fail" not in _levels(result).values(), (hostile.name, _levels(result))
    (layer,) = (h for h in inputs if h.name == "transformer-layer-gelu")
    assert _levels(cli(*layer.args, "--format", "json"))["torch._C._nn.gelu"] == "ok"


def test_stored_callables_class_is_registered() -> None:
    assert stored_callables.KLASS in corpus.GATE_CLASSES
