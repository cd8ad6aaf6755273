"""Class "gadgets": a class outside the allowlist fails however the pickle uses it (issue 27: fail closed; it was a
warning when only rebuilt from plain state); only the vetted framework classes (``TrainingArguments`` and its enums)
rebuilt as plain data stay a warning, so real checkpoints (optimizer states, RNG states, Namespace hparams) pass."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dtypecheck.loaders._io.pickle_globals import classify, judge
from dtypecheck.loaders._io.pickle_vm import GlobalRef, unpickle
from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import torch_load_all


def test_shipped_with_torch_gadgets_fail_and_sympy_lambda_is_live(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    inputs = corpus.build(tmp_path, ("gadgets",))
    assert len(inputs) == 6
    for hostile in inputs:
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 1, (hostile.name, result.stderr)
        (gadget,) = [f for f in result.json()["findings"] if f["kind"] == "pickle-global" and f["level"] != "ok"]
        assert gadget["level"] == "fail", (hostile.name, gadget)
        assert [t["name"] for t in result.json()["tensors"]] == ["w"]
    live = [h for h in inputs if h.canary is not None]
    assert [h.name for h in live] == ["sympy-lambda", "sympy-lambda-top-level"]
    assert not any(h.canary is not None and h.canary.exists() for h in live)
    torch_load_all([h.torch_load for h in live if h.torch_load is not None])
    assert all(h.canary is not None and h.canary.exists() for h in live)


class Strategy(enum.Enum):
    STEPS = "steps"


@dataclasses.dataclass
class Arguments:  # pickled as TrainingArguments is: NEWOBJ without arguments, BUILD of its __dict__
    output_dir: str = "out"
    strategy: Strategy = Strategy.STEPS


class WithState:
    def __init__(self) -> None:
        self.x = 1

    def __getstate__(self) -> list[int]:
        return [self.x]

    def __setstate__(self, state: list[int]) -> None:
        self.x = state[0]


class Called:
    def __init__(self, a: str, b: int) -> None:
        self.a, self.b = a, b

    def __reduce__(self) -> tuple[object, tuple[str, int]]:
        return Called, (self.a, self.b)


def _levels(value: object, protocol: int) -> dict[str, str]:
    _, refs = unpickle(pickle.dumps(value, protocol=protocol), where="t")
    return {ref.name: classify(ref) for ref in refs if ref.module == __name__}


@pytest.mark.parametrize("protocol", [0, 1, 2, 4, 5])
def test_unvetted_classes_fail_in_every_protocol(protocol: int) -> None:
    assert _levels(Arguments(), protocol) == {"Arguments": "fail", "Strategy": "fail"}  # unvetted: fail closed
    assert _levels(WithState(), protocol) == {"WithState": "fail"}  # BUILD of a list: only __setstate__ takes it
    assert _levels(Called("x", 2), protocol) == {"Called": "fail"}


def test_call_rule_by_hand() -> None:
    # an unvetted package fails however it is used: importing it runs its code
    for uses in (frozenset(), frozenset({"value"}), frozenset({"new", "state"}), frozenset({"call"})):
        assert classify(GlobalRef("pkg.mod", "Config", uses)) == "fail"
        assert classify(GlobalRef("sympy.matrices.dense", "MutableDenseMatrix", uses)) == "fail"
    assert "used as call" in judge(GlobalRef("networkx", "Graph", frozenset({"call"})))[1]
    # a vetted class warns only on its own path
    args, strategy = "transformers.training_args", "transformers.trainer_utils"
    assert classify(GlobalRef(args, "TrainingArguments", frozenset({"new", "state"}))) == "warn"
    assert classify(GlobalRef(args, "TrainingArguments", frozenset({"new", "setstate"}))) == "fail"
    assert classify(GlobalRef(args, "TrainingArguments", frozenset({"call"}))) == "fail"
    assert classify(GlobalRef(strategy, "IntervalStrategy", frozenset({"value"}))) == "warn"
    assert classify(GlobalRef(strategy, "IntervalStrategy", frozenset({"value", "call"}))) == "fail"


def test_real_training_states_keep_passing(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """An optimizer, a scheduler and RNG states as Trainer and Lightning save them: nothing fails."""
    import numpy as np

    model = torch.nn.Linear(3, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": torch.get_rng_state(),
        "numpy_rng": np.random.default_rng(0).bit_generator.state,
        "legacy_numpy_rng": np.random.get_state(),
        "hyper_parameters": argparse.Namespace(lr=0.1, name="run"),
    }
    torch.save(state, tmp_path / "last.ckpt")
    result = cli("scan-model", str(tmp_path / "last.ckpt"), "--format", "json")
    assert result.exit_code == 0, result.stderr
    levels = {f["detail"]: f["level"] for f in result.json()["findings"] if f["kind"] == "pickle-global"}
    assert levels["argparse.Namespace"] == "ok"
    assert [d for d, level in levels.items() if level != "ok"] == []
