"""What each tensor of a training checkpoint is, and whether a cast to the targets says anything about it.

A training checkpoint holds more than weights: torch.optim's ``state[i]["step"]`` is a float32 scalar of ~1e6 that
torch keeps in float32 whatever the parameters' dtype, so judging it against float16 fails every checkpoint for a
value that is never cast. Each tensor gets a role from its key path, by the first rule that matches:

- ``bookkeeping`` (step counters, BatchNorm's ``num_batches_tracked``, RNG state, GradScaler/loss-scaler state,
  learning-rate schedulers, Lightning's callbacks and loops, epoch/step counters): kept in their own dtype by the
  framework by design; reported, **not judged** against the targets (their own NaN/inf still is);
- ``optimizer``: DeepSpeed's optimizer states and fp32 master partitions, which DeepSpeed keeps in float32 whatever
  the model's dtype: judged in float32, so **not judged** against the targets; torch.optim's moments
  (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``...), which torch.optim keeps in their parameter's dtype
  (``zeros_like(param)``): judged against the targets, as the weights they follow;
- ``model`` (everything else: parameters and buffers): judged against the targets.

The rules match key paths as the loaders name them (``optimizer.state.3.step``, ``optimizer_states.0.state.3.step``
for Lightning, ``rng_state.cpu`` in a Hugging Face Trainer folder); ``ROLE_RULES`` is the one list, which the README
and the report's ``not_judged`` quote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Role = Literal["model", "optimizer", "bookkeeping"]
ROLES: tuple[Role, ...] = ("model", "optimizer", "bookkeeping")


@dataclass(frozen=True)
class RoleRule:
    """Tensors whose key path matches ``pattern`` (``re.search``) have ``role``."""

    name: str
    """How the report and the README name the rule."""
    pattern: re.Pattern[str]
    role: Role
    not_judged: str | None
    """Why their casts are not judged against the targets; None when they are."""
    model_buffer: bool = False
    """A buffer of the model itself (kept by ``--weights-only``), though bookkeeping."""


def _rule(name: str, pattern: str, role: Role, not_judged: str | None, *, model_buffer: bool = False) -> RoleRule:
    return RoleRule(name, re.compile(pattern), role, not_judged, model_buffer)


_OPTIMIZER_MOMENTS = (
    "exp_avg|exp_avg_sq|max_exp_avg_sq|momentum_buffer|square_avg|acc_delta|sum|mu|eta|ax|prev|step_size|grad_avg"
)

ROLE_RULES: tuple[RoleRule, ...] = (
    _rule(
        "optimizer step counter",
        r"(?:^|\.)state\.\d+\.step$",
        "bookkeeping",
        "torch.optim keeps its step counters in float32 whatever the parameters' dtype",
    ),
    _rule(
        "batch counter",
        r"(?:^|\.)num_batches_tracked$",
        "bookkeeping",
        "BatchNorm counts batches in an int64 buffer that no cast of the model touches",
        model_buffer=True,
    ),
    _rule(
        "RNG state",
        r"(?:^|\.)(?:rng_states?|random_states?|(?:cpu|cuda|torch|numpy)_rng_states?)(?:\.|$)",
        "bookkeeping",
        "random number generator state is bytes, not values",
    ),
    _rule(
        "loss scaler",
        r"(?:^|\.)(?:scaler|grad_scaler|loss_scaler|native_amp_scaling_state|MixedPrecision)(?:\.|$)"
        r"|(?:^|\.)(?:_?growth_tracker|cur_scale|dynamic_loss_scale)$",
        "bookkeeping",
        "GradScaler and loss-scaler state stays in float32 by design",
    ),
    _rule(
        "scheduler",
        r"(?:^|\.)(?:lr_schedulers?|schedulers?)(?:\.|$)",
        "bookkeeping",
        "learning-rate scheduler state is not cast with the model",
    ),
    _rule(
        "trainer state",
        r"^(?:callbacks|loops)\.",
        "bookkeeping",
        "Lightning's callback and loop state (scores, progress) is not cast with the model",
    ),
    _rule(
        "progress counter",
        r"(?:^|\.)(?:epoch|global_steps?|global_samples|skipped_steps|iteration|_step_count|last_epoch)$",
        "bookkeeping",
        "epoch and step counters are not cast with the model",
    ),
    _rule(
        "DeepSpeed optimizer state",
        r"(?:^|\.)(?:base_optimizer_state|single_partition_of_fp32_groups|fp32_flat_groups|fp32_groups_flat)(?:\.|$)",
        "optimizer",
        "DeepSpeed keeps optimizer states and fp32 master partitions in float32 whatever the model's dtype",
    ),
    _rule("optimizer moment", rf"(?:^|\.)state\.\d+\.(?:{_OPTIMIZER_MOMENTS})$", "optimizer", None),
)


def role_rule(name: str) -> RoleRule | None:
    """The first rule matching the tensor's key path; None for model parameters and buffers."""
    return next((rule for rule in ROLE_RULES if rule.pattern.search(name)), None)


__all__ = ["ROLES", "ROLE_RULES", "Role", "RoleRule", "role_rule"]
