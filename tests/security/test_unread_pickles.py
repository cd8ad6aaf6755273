"""Class "unread-pickles": every pickle torch.load or dcp.load would run is judged, wherever it hides."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import torch_load_all


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[corpus.Hostile]:
    return corpus.build(tmp_path_factory.mktemp("hostile"), ("unread-pickles",))


def test_hidden_pickles_fail_the_gate_and_their_canaries_are_live(
    built: list[corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    inputs = built
    assert len(inputs) == 9
    for hostile in inputs:
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 1, (hostile.name, result.stderr)
        fails = [f["detail"] for f in result.json()["findings"] if f["level"] == "fail"]
        assert any("exec" in d or "os.system" in d for d in fails), (hostile.name, fails)
        assert hostile.canary is not None
        assert not hostile.canary.exists()
    torch_load_all([h.torch_load for h in inputs if h.torch_load is not None])
    live = {h.name for h in inputs if h.canary is not None and h.canary.exists()}
    # torch picks one copy of a duplicated zip entry (by an unstable sort): one of the two files runs its payload.
    duplicates = {"zip-duplicate-data-pkl-0", "zip-duplicate-data-pkl-1"}
    assert len(live & duplicates) >= 1
    assert live - duplicates == {h.name for h in inputs} - duplicates


def test_duplicate_entries_and_polyglots_are_named(built: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    inputs = {h.name: h for h in built}
    kinds = {f["kind"] for f in cli(*inputs["zip-duplicate-data-pkl-0"].args, "-f", "json").json()["findings"]}
    assert "duplicate-entry" in kinds
    findings = cli(*inputs["safetensors-polyglot"].args, "-f", "json").json()["findings"]
    assert findings[0]["kind"] == "pickle-polyglot"
    assert findings[0]["level"] == "fail"
    # the polyglot is a valid safetensors file: the reference reader opens it and reads the same tensor
    from safetensors import safe_open

    with safe_open(str(inputs["safetensors-polyglot"].args[1]), "pt") as opened:
        assert len(list(opened.keys())) == 1
