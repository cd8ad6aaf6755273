"""Issue 27, class 6: no traceback of dtypecheck's own, one ``error:`` line (a user's factory: their frames only).

Each input of ``gate/tracebacks.py`` is run through the CLI boundary: benign files with names that are not
UTF-8 scan clean; the estimate-memory configs and the raising factory exit 3 with one ``error:`` line naming the
problem; a config whose ``auto_map`` names code shipped beside it is refused before transformers could import it
(or prompt to), so the shipped code's canary never appears.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.conftest import CliResult
from tests.security.corpus import Hostile
from tests.security.gate import tracebacks
from tests.security.harness import one_error_line, run_cli

MESSAGES = {
    "config-5001-digit-integer": "value has 5001 digits",
    "config-100k-deep": "JSON nested too deeply to read",
    "config-auto-map": "estimate-memory never runs a model's own code",
    "config-layers-1e9": "num_hidden_layers 1000000000.0 is not a layer count (0 to 10000)",
    "config-layers-int-1e9": "num_hidden_layers 1000000000 is not a layer count (0 to 10000)",
    "factory-parameters-raise-scan": "the model's named_parameters()/named_buffers() raised RuntimeError",
    "factory-parameters-raise-estimate": "the model's parameters() raised RuntimeError",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Hostile]:
    return {h.name: h for h in tracebacks.build(tmp_path_factory.mktemp("tracebacks"))}


def test_the_corpus_is_what_the_tests_name(built: dict[str, Hostile]) -> None:
    benign = {name for name, h in built.items() if h.benign}
    assert benign == {"non-utf8-torch-zip", "non-utf8-side-file", "non-utf8-legacy", "config-auto-map-merged-type"}
    assert set(built) - benign == set(MESSAGES)


@pytest.mark.parametrize("name", ["non-utf8-torch-zip", "non-utf8-side-file", "non-utf8-legacy"])
def test_names_that_are_not_utf8_scan_clean(
    name: str, built: dict[str, Hostile], cli: Callable[..., CliResult]
) -> None:
    hostile = built[name]
    # the name as Python holds it from a shell's bytes: surrogate escapes, which torch's reader cannot take as str
    assert any("\udc80" <= c <= "\udcff" for c in hostile.args[1]) or name == "non-utf8-side-file"
    result = cli(*hostile.args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert "Traceback" not in result.stderr
    names = [t["name"] for t in result.json()["tensors"]]
    assert names in (["w"], ["model.w"]), names


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_one_error_line(name: str, built: dict[str, Hostile], cli: Callable[..., CliResult]) -> None:
    hostile = built[name]
    result = cli(*hostile.args)
    assert result.exit_code == 3, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ")
    assert MESSAGES[name] in lines[-1], lines[-1]
    assert "/dtypecheck/" not in result.stderr  # no frame of dtypecheck's own
    if name.startswith("factory-"):  # the user's own frames, then the error line
        assert "raising_factory.py" in result.stderr
    else:
        assert one_error_line(result.stderr), result.stderr


def test_auto_map_code_is_never_imported(built: dict[str, Hostile]) -> None:
    hostile = built["config-auto-map"]
    assert hostile.canary is not None
    hostile.canary.unlink(missing_ok=True)
    done = run_cli(hostile.args)  # stdin closed: transformers' "run the custom code? [y/N]" prompt must not show
    assert done.returncode == 3
    assert one_error_line(done.stderr), done.stderr
    assert "Do you wish to run the custom code" not in done.stderr + done.stdout
    assert not hostile.canary.exists()
    # the shipped code is live: importing it, as trust_remote_code would, creates the canary
    folder = hostile.args[1].rsplit("/", 1)[0]
    subprocess.run([sys.executable, "-c", "import configuration_custom"], cwd=folder, check=True)
    assert hostile.canary.exists()


def test_an_auto_map_of_a_merged_model_type_builds_transformers_own_class(
    built: dict[str, Hostile], cli: Callable[..., CliResult]
) -> None:
    hostile = built["config-auto-map-merged-type"]
    assert hostile.canary is not None
    hostile.canary.unlink(missing_ok=True)
    result = cli(*hostile.args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    model = result.json()["model"]
    assert model["model_class"] == "LlamaForCausalLM"
    import torch
    import transformers

    config = transformers.LlamaConfig(**{k: v for k, v in tracebacks.CONFIG.items() if k != "architectures"})
    with torch.device("meta"):  # the count, from transformers' own class
        expected = sum(p.numel() for p in transformers.LlamaForCausalLM(config).parameters())
    assert model["parameters"] == expected
    assert not hostile.canary.exists()
