"""Red team, round 6: the dotted paths sentence-transformers imports from a model folder's JSON files (a module's
``type``, a Dense activation, a cross-encoder's activation) fail the gate unless shown inert, and so does a
``hubconf.py`` (torch.hub runs it); each payload is live under the loader that reads it, and real saves pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from dtypecheck.loaders._io.shipped_code import code_references, sentence_transformers_code
from tests.conftest import CliResult
from tests.security import corpus
from tests.security.gate import library_loaders
from tests.security.harness import assert_cli_fails_each_in_its_own_process, payload_scans, prove_live

# name -> the file and the dotted path its contains-code fail names
EXPECTED_FAIL = {
    "module-type": ("modules.json", "'custom_normalize.Normalize'"),
    "dense-activation": ("2_Dense/config.json", "'fast_tanh.Tanh'"),
    "cross-encoder-activation": ("config.json", "'calibrated.Sigmoid'"),
    "hubconf": ("hubconf.py", "torch.hub.load("),
}
BENIGN = {"sentence-embedder", "cross-encoder"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[corpus.Hostile]:
    return corpus.build(tmp_path_factory.mktemp("libraries"), (library_loaders.KLASS,))


def _fails(result: CliResult) -> list[tuple[str, str]]:
    return [(f["kind"], f["detail"]) for f in result.json()["findings"] if f["level"] == "fail"]


def test_every_payload_fails_the_gate(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    assert {h.name for h in inputs if not h.benign} == set(EXPECTED_FAIL)
    for hostile, result in payload_scans(inputs, cli):
        label, named = EXPECTED_FAIL[hostile.name]
        (fail,) = _fails(result)
        assert fail[0] == "contains-code"
        assert fail[1].startswith(f"{label}: ")
        assert named in fail[1], fail


def test_every_payload_is_live(inputs: list[corpus.Hostile]) -> None:
    assert prove_live(inputs) == set(EXPECTED_FAIL)


def test_the_cli_fails_them_in_a_process_of_its_own(inputs: list[corpus.Hostile]) -> None:
    assert_cli_fails_each_in_its_own_process(inputs)


def test_real_saves_pass(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    assert {h.name for h in inputs if h.benign} == BENIGN
    for hostile in (h for h in inputs if h.benign):
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 0, (hostile.name, result.json()["findings"])
        assert _fails(result) == [], hostile.name


@pytest.mark.parametrize(
    ("name", "document", "named"),
    [
        # what each version of sentence-transformers writes: inert
        ("modules.json", [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"}], set()),
        ("config.json", {"activation_function": "gelu_new", "model_type": "gpt2"}, set()),  # GPT-2's own name
        ("config.json", {"in_features": 8, "activation_function": "torch.nn.modules.activation.Tanh"}, set()),
        ("config.json", {"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, set()),
        ("config_sentence_transformers.json", {"activation_fn": "torch.nn.modules.activation.Sigmoid"}, set()),
        ("router_config.json", {"types": {"q": "sentence_transformers.models.Router"}}, set()),
        ("wordembedding_config.json", {"tokenizer_class": "sentence_transformers.models.tokenizer.X"}, set()),
        ("tokenizer_config.json", {"tokenizer_class": "BertTokenizer"}, set()),  # transformers': no module path
        # what they would import from elsewhere
        (
            "modules.json",
            [{"type": "sentence_transformers_evil.X"}],
            {"a module of type 'sentence_transformers_evil.X'"},
        ),
        (
            "modules.json",
            [{"type": "sentence_transformers.models.Dense", "path": "../x"}],
            {"a module at '../x' (outside the folder)"},
        ),
        ("modules.json", [{"type": None}], {"a module of type None"}),
        (
            "config.json",
            {"activation_function": "torch.distributed.breakpoint"},
            {"the activation 'torch.distributed.breakpoint'"},
        ),
        ("config.json", {"activation_function": "os.fork"}, {"the activation 'os.fork'"}),
        ("config.json", {"sbert_ce_default_activation_function": "x.y"}, {"the activation 'x.y'"}),
        (
            "config.json",
            {"sentence_transformers": {"activation_fn": "torch.cuda.init"}},
            {"the activation 'torch.cuda.init'"},
        ),
        ("config.json", {"types": {"q": "router_code.Q"}}, {"a Router module of type 'router_code.Q'"}),
        ("router_config.json", {"types": {"q": "router_code.Q"}}, {"a Router module of type 'router_code.Q'"}),
        ("wordembedding_config.json", {"tokenizer_class": "tok.T"}, {"the tokenizer class 'tok.T'"}),
    ],
)
def test_each_dotted_path_is_inert_only_inside_sentence_transformers_or_as_an_activation_class(
    name: str, document: object, named: set[str]
) -> None:
    assert sentence_transformers_code(document, name) == named


def test_an_escaped_key_is_read_as_the_loader_reads_it(tmp_path: Path) -> None:
    """``\\u`` escapes spell the key for json.loads as for the scan: the file is parsed, not matched by bytes."""
    (tmp_path / "2_Dense").mkdir()
    config = tmp_path / "2_Dense" / "config.json"
    config.write_text('{"activation\\u005ffunction": "fast_tanh.Tanh"}')
    assert json.loads(config.read_text()) == {"activation_function": "fast_tanh.Tanh"}
    (finding,) = code_references(config, "2_Dense/config.json")
    assert (finding.kind, finding.level) == ("contains-code", "fail")


def test_sentence_transformers_class_is_registered() -> None:
    assert library_loaders.KLASS in corpus.GATE_CLASSES


def test_a_file_too_large_to_parse_fails_where_a_loader_would_read_code_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``MAX_CONFIG_BYTES`` nothing is parsed: a file a loader reads code references from by its name, or one
    holding a key that names code, fails unread; any other is left alone (a large ``tokenizer.json``)."""
    from dtypecheck.loaders._io import shipped_code

    monkeypatch.setattr(shipped_code, "MAX_CONFIG_BYTES", 64)
    padding = " " * 64
    cases = {
        "modules.json": f'[{{"type": "custom_st.Evil"}}]{padding}',
        "model_index.json": f'{{"unet": ["my_unet", "MyUNet"]}}{padding}',
        "2_Dense/config.json": f'{{"activation_function": "fast_tanh.Tanh"}}{padding}',
        "other.json": f'{{"activation_function": "fast_tanh.Tanh"}}{padding}',
        "tokenizer.json": f'{{"model": {{"vocab": {{"a": 0}}}}}}{padding}',
    }
    found = {}
    for name, text in cases.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        found[name] = [(f.kind, f.level) for f in code_references(path, name)]
    unread = [("unreadable-file", "fail")]
    assert found == {name: ([] if name == "tokenizer.json" else unread) for name in cases}
