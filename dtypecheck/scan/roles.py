"""What each tensor of a training checkpoint is, and whether a cast to the targets says anything about it.

A training checkpoint holds more than weights: torch.optim's ``state[i]["step"]`` is a float32 scalar of ~1e6 that
torch keeps in float32 whatever the parameters' dtype, so judging it against float16 fails every checkpoint for a
value that is never cast. But a name is only a name: a weight saved as ``optimizer.state.0.step``, ``scaler.w`` or
``epoch`` must not escape the gate. So a tensor's role follows from the checkpoint's structure (the key paths of
all its tensors) **and** from the tensor's own shape and dtype, and a tensor that fits no role is the model's:

- ``bookkeeping`` (not judged against the targets; its own NaN/inf still is): a 0-dim (one-element) step counter
  inside an optimizer state dict (every tensor under its prefix is ``state.N.<an optimizer's own key>`` or
  ``param_groups.N.*``); an integer one-element ``num_batches_tracked`` beside a ``running_mean``; integer RNG
  state (a ``rng_state*``/``random_states*`` file or key, or a file holding nothing but torch's and numpy's
  generator states); and one-element values of a loss scaler, of a top-level learning-rate scheduler, of
  Lightning's top-level ``callbacks``/``loops`` and of epoch/step counters;
- ``optimizer``: the moments of an optimizer state dict (judged against the targets, as torch.optim keeps them in
  their parameter's dtype), except what is kept in float32 by design and never cast: a DeepSpeed ZeRO optimizer
  state dict's flat (1-D) float32 partitions and states, and Adafactor's factored second moments
  (``exp_avg_sq_row``/``exp_avg_sq_col`` of transformers, ``row_var``/``col_var`` of torch.optim, in float32, rows
  and columns of one shape, and its 0-dim ``RMS``);
- ``model`` (everything else, whatever its name: a (64, 64) float32 ``scaler.w`` or ``callbacks.x.average_model_state``
  of Lightning's StochasticWeightAveraging, a diffusion scheduler's ``alphas_cumprod`` buffer): judged.

``ROLE_RULES`` lists the roles by name, as the README and the report's ``not_judged`` quote them;
``assign_roles`` decides, once per checkpoint, from every tensor's name, shape and dtype.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Role = Literal["model", "optimizer", "bookkeeping"]
ROLES: tuple[Role, ...] = ("model", "optimizer", "bookkeeping")


@dataclass(frozen=True)
class RoleRule:
    """A role a tensor can have besides the model's, by name (``ROLE_RULES``)."""

    name: str
    """How the report and the README name the rule."""
    role: Role
    not_judged: str | None
    """Why their casts are not judged against the targets; None when they are."""
    fits: str
    """Where such a tensor lies and what shape and dtype it has, in the README's words."""
    model_buffer: bool = False
    """A buffer of the model itself (kept by ``--weights-only``), though bookkeeping."""
    infinite_sentinel: bool = False
    """Whether ±inf (never NaN) is a value this role holds by design: a score not yet set."""


class Layout(Protocol):
    """What roles are decided from: a tensor's key path, dtype and shape (a ``TensorRecord``, a ``TensorScan``)."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


STEP = RoleRule(
    "optimizer step counter",
    "bookkeeping",
    "torch.optim keeps its step counters in float32 whatever the parameters' dtype",
    "a one-element `state.N.step` of an optimizer state dict",
)
BATCHES = RoleRule(
    "batch counter",
    "bookkeeping",
    "BatchNorm counts batches in an int64 buffer that no cast of the model touches",
    "a one-element integer `num_batches_tracked` beside its `running_mean`",
    model_buffer=True,
)
RNG = RoleRule(
    "RNG state",
    "bookkeeping",
    "random number generator state is bytes, not values",
    "an integer tensor of a `rng_state*`/`random_states*` file or key, or of a file of nothing but generator states",
)
SCALER = RoleRule(
    "loss scaler",
    "bookkeeping",
    "GradScaler and loss-scaler state stays in float32 by design",
    "a one-element value under `scaler`, `grad_scaler`, `loss_scaler`, `MixedPrecision`...",
)
SCHEDULER = RoleRule(
    "scheduler",
    "bookkeeping",
    "learning-rate scheduler state is not cast with the model",
    "a one-element value under a top-level `lr_scheduler(s)`/`scheduler(s)`",
)
TRAINER = RoleRule(
    "trainer state",
    "bookkeeping",
    "Lightning's callback and loop state (scores, progress) is not cast with the model",
    "a one-element value under Lightning's top-level `callbacks` or `loops`",
    infinite_sentinel=True,  # ModelCheckpoint's kth_value and EarlyStopping's best_score start at ±inf
)
PROGRESS = RoleRule(
    "progress counter",
    "bookkeeping",
    "epoch and step counters are not cast with the model",
    "a one-element `epoch`, `global_step`, `iteration`, `last_epoch`...",
)
DEEPSPEED = RoleRule(
    "DeepSpeed optimizer state",
    "optimizer",
    "DeepSpeed keeps optimizer states and fp32 master partitions in float32 whatever the model's dtype",
    "a flat (1-D) float32 tensor of a DeepSpeed ZeRO optimizer state dict (`fp32_flat_groups`, "
    "`single_partition_of_fp32_groups`, `base_optimizer_state`, ZeRO-3's `optimizer_state_dict`)",
)
FACTORED = RoleRule(
    "factored second moment",
    "optimizer",
    "Adafactor keeps its factored second moments (row and column statistics) in float32, never cast",
    "Adafactor's float32 `exp_avg_sq_row`/`exp_avg_sq_col` or `row_var`/`col_var` (a row and a column of one "
    "shape) and its 0-dim `RMS`, in an optimizer state dict",
)
MOMENT = RoleRule(
    "optimizer moment",
    "optimizer",
    None,
    "any other tensor of an optimizer state dict (`exp_avg`, `exp_avg_sq`, `momentum_buffer`...): judged",
)

ROLE_RULES: tuple[RoleRule, ...] = (
    STEP,
    BATCHES,
    RNG,
    SCALER,
    SCHEDULER,
    TRAINER,
    PROGRESS,
    DEEPSPEED,
    FACTORED,
    MOMENT,
)

OPTIMIZER_KEYS = frozenset(
    {
        # torch.optim: Adam(W), NAdam, RAdam, Adamax, SGD, RMSprop, Adagrad, Adadelta, ASGD, Rprop, LBFGS, Adafactor
        *("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "mu_product", "exp_inf", "momentum_buffer"),
        *("square_avg", "grad_avg", "sum", "acc_delta", "eta", "mu", "ax", "prev", "step_size"),
        *("d", "t", "old_dirs", "old_stps", "ro", "H_diag", "prev_flat_grad", "prev_loss", "al"),
        *("row_var", "col_var", "variance"),
        # transformers' Adafactor
        *("exp_avg_sq_row", "exp_avg_sq_col", "RMS"),
    }
)
"""The state keys of the optimizers whose state dicts dtypecheck knows; an unknown key makes the whole state dict
an unknown structure, judged as the model's."""

DEEPSPEED_KEYS = frozenset(
    {
        *("loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad", "zero_stage", "partition_count"),
        *("base_optimizer_state", "single_partition_of_fp32_groups", "fp32_flat_groups", "fp32_groups_flat"),
        *("optimizer_state_dict", "group_paddings", "param_slice_mappings", "ds_version"),
    }
)
"""The keys of a DeepSpeed ZeRO optimizer's ``state_dict()`` (stage 1/2 ``_rigid_state_dict`` and stage 3's, and
BF16_Optimizer's), as DeepSpeed's ``checkpoint/constants.py`` names them."""
_DEEPSPEED_MARKS = ("single_partition_of_fp32_groups", "fp32_flat_groups", "fp32_groups_flat", "base_optimizer_state")

_STATE_KEY = re.compile(r"(state\.\d+)\.([A-Za-z_]+)(?:\.\d+)?")
_GROUP_KEY = re.compile(r"param_groups\.\d+\.[^.]+(?:\.\d+)?")
_CONTAINER_AT = re.compile(r"(?:^|\.)(?:state|param_groups)\.\d+\.")
_RNG_SEGMENT = re.compile(
    r"(?:^|\.)(?:rng_states?(?:_\d+)?|random_states?(?:_\d+)?|(?:cpu|cuda|torch|numpy|torch_cuda)_rng_states?"
    r"|torch_manual_seed|torch_cuda_manual_seed)(?:\.|$)"
)
_GENERATOR_FILE_KEYS = frozenset({"cpu", "cuda", "numpy", "mps", "xla", "npu", "hpu", "mlu", "musa", "xpu"})
_SCALER = re.compile(
    r"(?:^|\.)(?:scaler|grad_scaler|loss_scaler|native_amp_scaling_state|amp_scaling_state|MixedPrecision)(?:\.|$)"
    r"|(?:^|\.)(?:_?growth_tracker|cur_scale|dynamic_loss_scale)$"
)
_SCHEDULER = re.compile(r"^(?:lr_schedulers?|schedulers?)\.")
_TRAINER = re.compile(r"^(?:callbacks|loops)\.")
_PROGRESS = re.compile(
    r"(?:^|\.)(?:epoch|global_steps?|global_samples|skipped_steps|iteration|_step_count|last_epoch)$"
)
_FLOAT32 = frozenset({"float32", "float64"})


def _one_element(layout: Layout) -> bool:
    return math.prod(layout.shape) <= 1 and len(layout.shape) <= 1


def _integer(layout: Layout) -> bool:
    return layout.dtype.startswith(("int", "uint"))


class _Names:
    """Every key path of a checkpoint, sorted, to ask which lie under a prefix."""

    def __init__(self, names: Iterable[str]) -> None:
        self.sorted = sorted(names)

    def under(self, prefix: str) -> list[str]:
        start = bisect.bisect_left(self.sorted, prefix)
        end = start
        while end < len(self.sorted) and self.sorted[end].startswith(prefix):
            end += 1
        return self.sorted[start:end]


def _deepspeed_containers(names: _Names) -> list[str]:
    """Prefixes holding a DeepSpeed ZeRO optimizer state dict: one of its marks, and nothing but its keys."""
    found = set()
    for name in names.sorted:
        for mark in _DEEPSPEED_MARKS:
            at = name.find(mark + ".")
            if at == 0 or (at > 0 and name[at - 1] == "."):
                found.add(name[:at])
    return sorted(
        prefix
        for prefix in found
        if all(rest.split(".", 1)[0] in DEEPSPEED_KEYS for rest in (n[len(prefix) :] for n in names.under(prefix)))
    )


def _optimizer_containers(names: _Names) -> list[str]:
    """Prefixes holding a torch.optim-style state dict: every tensor under it is ``state.N.<known key>`` or
    ``param_groups.N.*``, and at least one is state."""
    found = {
        name[: m.start() + (1 if m.group().startswith(".") else 0)]
        for name in names.sorted
        for m in _CONTAINER_AT.finditer(name)
    }
    containers = []
    for prefix in sorted(found):
        rests = [n[len(prefix) :] for n in names.under(prefix)]
        states = [_STATE_KEY.fullmatch(rest) for rest in rests]
        if not any(states):
            continue
        if all(
            (state is not None and state.group(2) in OPTIMIZER_KEYS) or _GROUP_KEY.fullmatch(rest)
            for rest, state in zip(rests, states, strict=True)
        ):
            containers.append(prefix)
    return containers


def _factored_pairs(state: Mapping[str, Layout]) -> set[str]:
    """The keys of one parameter's Adafactor state that are factored moments as Adafactor shapes them: float32, a
    row and a column statistic of one parameter shape (transformers: ``S[:-1]`` and ``S[:-2] + S[-1:]``; torch:
    ``S[:-1] + (1,)`` and ``S[:-2] + (1,) + S[-1:]``), and a 0-dim ``RMS``."""
    fitting = set()
    for row_key, col_key, keepdim in (("exp_avg_sq_row", "exp_avg_sq_col", False), ("row_var", "col_var", True)):
        row, col = state.get(row_key), state.get(col_key)
        if row is None or col is None or {row.dtype, col.dtype} - _FLOAT32 or len(row.shape) != len(col.shape):
            continue
        if keepdim:
            ok = len(row.shape) >= 2 and row.shape[-1] == 1 and col.shape[-2] == 1 and row.shape[:-2] == col.shape[:-2]
        else:
            ok = len(row.shape) >= 1 and row.shape[:-1] == col.shape[:-1]
            moment = state.get("exp_avg")
            if ok and moment is not None and len(moment.shape) >= 2:
                ok = moment.shape[:-1] == row.shape and moment.shape[:-2] + moment.shape[-1:] == col.shape
        if ok:
            fitting |= {row_key, col_key}
    rms = state.get("RMS")
    if rms is not None and rms.dtype in _FLOAT32 and _one_element(rms):
        fitting.add("RMS")
    return fitting


def _optimizer_roles(prefix: str, layouts: Mapping[str, Layout], deepspeed: bool) -> dict[str, RoleRule]:
    """The roles inside one optimizer state dict at ``prefix``."""
    states = {name: _STATE_KEY.fullmatch(name[len(prefix) :]) for name in layouts}
    by_state: dict[str, dict[str, Layout]] = {}
    for name, state in states.items():
        if state is not None:
            by_state.setdefault(state.group(1), {})[state.group(2)] = layouts[name]
    factored = {entry: _factored_pairs(held) for entry, held in by_state.items()}
    roles = {}
    for name, layout in layouts.items():
        state = states[name]
        key = state.group(2) if state is not None else ""
        if key == "step":
            roles[name] = STEP if _one_element(layout) else MOMENT
        elif deepspeed and layout.dtype in _FLOAT32 and len(layout.shape) == 1:
            roles[name] = DEEPSPEED
        elif state is not None and key in factored[state.group(1)]:
            roles[name] = FACTORED
        else:
            roles[name] = MOMENT
    return roles


def _generator_file(layouts: Sequence[Layout]) -> bool:
    """A file of nothing but generator states (HF Trainer's ``rng_state.pth`` scanned alone): integer tensors
    under ``cpu``, ``cuda``, ``numpy``..."""
    return bool(layouts) and all(
        layout.name.split(".", 1)[0] in _GENERATOR_FILE_KEYS and _integer(layout) for layout in layouts
    )


def assign_roles(layouts: Iterable[Layout]) -> dict[str, RoleRule]:
    """Each tensor's role by key path, for those that are not the model's (absent: ``model``), decided from the
    whole checkpoint's structure and each tensor's shape and dtype."""
    every = {layout.name: layout for layout in layouts}
    names = _Names(every)
    roles: dict[str, RoleRule] = {}
    for prefix in _deepspeed_containers(names):
        inside = {n: every[n] for n in names.under(prefix)}
        for name, layout in inside.items():
            if name.startswith((prefix + "loss_scaler.", prefix + "dynamic_loss_scale")):
                roles[name] = SCALER if _one_element(layout) else MOMENT
            elif layout.dtype in _FLOAT32 and len(layout.shape) == 1:
                roles[name] = DEEPSPEED
        for nested in ("base_optimizer_state.", "optimizer_state_dict."):
            held = {n: every[n] for n in names.under(prefix + nested) if n not in roles}
            if held:
                roles.update(_optimizer_roles(prefix + nested, held, deepspeed=True))
    for prefix in _optimizer_containers(names):
        inside = {n: every[n] for n in names.under(prefix) if n not in roles}
        roles.update(_optimizer_roles(prefix, inside, deepspeed=False))
    generators = _generator_file(list(every.values()))
    for name, layout in every.items():
        if name in roles:
            continue
        rule = _by_place(name, layout, every, generators)
        if rule is not None:
            roles[name] = rule
    return roles


def _by_place(name: str, layout: Layout, every: Mapping[str, Layout], generators: bool) -> RoleRule | None:
    """The role of a tensor outside any optimizer state dict, when its place and its shape and dtype both fit."""
    if (generators or _RNG_SEGMENT.search(name)) and _integer(layout):
        return RNG
    if not _one_element(layout):
        return None
    if name == "num_batches_tracked" or name.endswith(".num_batches_tracked"):
        beside = name.removesuffix("num_batches_tracked") + "running_mean"
        return BATCHES if _integer(layout) and beside in every else None
    for pattern, rule in ((_SCALER, SCALER), (_SCHEDULER, SCHEDULER), (_TRAINER, TRAINER), (_PROGRESS, PROGRESS)):
        if pattern.search(name):
            return rule
    return None


__all__ = ["ROLES", "ROLE_RULES", "Layout", "Role", "RoleRule", "assign_roles"]
