"""The word lists of ``estimate-memory``, each spelled once: the Typer choices, the ``[tool.dtypecheck]``
validation (``dtypecheck/config.py``), the core and the docs all read these enums.

Torch-free, so that the config can be validated without loading torch; on the ground floor, beside the cores
rather than inside ``memory/``, so that ``config.py`` never imports another core's internals.
"""

from __future__ import annotations

from dtypecheck.choices import StrChoice
from dtypecheck.training_step import LossName


class Mode(StrChoice):
    """What is run: a forward pass, or a whole training step."""

    inference = "inference"
    training = "training"


class Optimizer(StrChoice):
    """The optimizer whose states are counted."""

    adamw = "adamw"
    adam = "adam"
    sgd = "sgd"
    lion = "lion"
    adafactor = "adafactor"
    adam8bit = "adam8bit"


class Precision(StrChoice):
    """How training keeps its weights: ``pure`` in the dtype, ``amp`` float32 with autocast compute in the dtype,
    ``master`` in the dtype plus a float32 master copy."""

    pure = "pure"
    amp = "amp"
    master = "master"


class OptimizerImpl(StrChoice):
    """The torch optimizer implementation whose step transient is counted."""

    foreach = "foreach"
    for_loop = "for-loop"
    fused = "fused"


class Strategy(StrChoice):
    """How the model states are spread over ``world_size`` devices."""

    none = "none"
    ddp = "ddp"
    zero1 = "zero1"
    zero2 = "zero2"
    zero3 = "zero3"
    fsdp = "fsdp"


class DeviceKind(StrChoice):
    """Where the step runs (it decides the optimizer implementation torch picks by default)."""

    cpu = "cpu"
    cuda = "cuda"


__all__ = ["DeviceKind", "LossName", "Mode", "Optimizer", "OptimizerImpl", "Precision", "Strategy"]
