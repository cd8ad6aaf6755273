"""Class "globals": every gadget that runs code under torch.load(weights_only=False) fails the gate."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dtypecheck.loaders._io.pickle_globals import ALLOWED, classify, judge
from dtypecheck.loaders._io.pickle_vm import GlobalRef
from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import torch_load_all


def test_every_gadget_fails_the_gate_and_its_canary_is_live(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    inputs = corpus.build(tmp_path, ("globals",))
    expected = {f"global-{name}": gadget for name, (gadget, _) in corpus.gadgets(tmp_path).items()}
    assert len(inputs) == len(expected) == 11
    for hostile in inputs:
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 1, (hostile.name, result.stderr)
        levels = {f["detail"]: f["level"] for f in result.json()["findings"] if f["kind"] == "pickle-global"}
        assert levels[expected[hostile.name]] == "fail", hostile.name
        assert hostile.canary is not None
        assert not hostile.canary.exists()
    # The same files really run their payload under torch.load(weights_only=False), except the user function
    # (``__main__.evil`` does not exist in a throwaway process: it is there to show the rule for unknown functions).
    torch_load_all([h.torch_load for h in inputs if h.torch_load is not None])
    live = {h.name for h in inputs if h.canary is not None and h.canary.exists()}
    assert live == set(expected) - {"global-user-function"}


@pytest.mark.parametrize(
    ("module", "name", "level"),
    [
        ("torch._utils", "_rebuild_tensor_v2", "ok"),
        ("collections", "OrderedDict", "ok"),
        ("torch", "BFloat16Storage", "ok"),
        ("torch.cuda", "FloatStorage", "ok"),
        ("numpy._core.multiarray", "_reconstruct", "ok"),
        ("numpy.dtypes", "Float32DType", "ok"),  # checked against numpy's real class
        ("torch.nn.modules.linear", "Linear", "ok"),  # a whole pickled model: nn.Module subclasses
        ("torch.optim.adamw", "AdamW", "ok"),
        ("argparse", "Namespace", "ok"),  # Lightning hparams
        ("pytorch_lightning.utilities.parsing", "AttributeDict", "fail"),  # unvetted: importing it runs its code
        ("transformers.training_args", "TrainingArguments", "warn"),  # vetted (only referenced here)
        ("transformers.utils.hub", "cached_file", "fail"),  # a function of an unvetted package
        ("torch._utils", "_rebuild_tensor_v2.__globals__", "fail"),  # attribute walk from an allowed name
        ("torch", "_utils._rebuild_tensor_v2", "fail"),  # the same object, reached by a walk: judged as a walk
        ("torch.nn.modules.linear", "F", "fail"),  # a module: stored, its attributes may be looked up and called
        ("torch.nn.functional", "relu", "ok"),  # a plain reference to an activation function: inert
        ("torch._C._nn", "gelu", "ok"),  # F.gelu, as pickle spells it
        ("torch.nn.functional", "_canonical_mask", "fail"),  # a private helper is no activation
        ("numpy", "float32", "ok"),  # a scalar type (a dtype of an hparam)
        ("numpy", "savetxt", "fail"),  # stored where __setstate__ calls it, it writes a file (folder-loaders)
        ("torch.nn.modules.module", "__builtins__", "fail"),
        ("os.path", "join", "fail"),
        ("numpy", "load", "fail"),  # stored, even never called by the pickle: see test_optimizer_setstate_gadget
        ("torch", "load", "fail"),
        ("copyreg.extension", "7", "fail"),
        ("os\nsystem", "x", "fail"),
    ],
)
def test_allowlist_levels(module: str, name: str, level: str) -> None:
    assert classify(GlobalRef(module, name)) == level, judge(GlobalRef(module, name))


@pytest.mark.parametrize("use", ["call", "value", "new", "state", "setstate", "items", "handed"])
@pytest.mark.parametrize(("module", "name"), [("torch", "load"), ("numpy", "load"), ("torch.nn.modules.linear", "F")])
def test_used_torch_names_fail(module: str, name: str, use: str) -> None:
    """The issue-27 rule: a torch or numpy name outside the allowlist is never ok once used (and, stored, only
    when it is an activation function or a numpy scalar type)."""
    assert classify(GlobalRef(module, name, frozenset({use}))) == "fail"


def test_allowlist_holds_what_torchs_own_weights_only_unpickler_allows() -> None:
    import torch._weights_only_unpickler as weights_only

    torch_allows = set(weights_only._get_allowed_globals())
    assert torch_allows <= ALLOWED, sorted(torch_allows - ALLOWED)
