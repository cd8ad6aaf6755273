"""How nan-trace runs the user's code, traced or watched alike (``runner``): a script as ``__main__``
with its own argv and import path, or a factory's model trained for N forward + backward + SGD steps.

The two modes differ only in what watches the run and in what an exception becomes, so everything else lives here.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from dtypecheck.errors import InputError
from dtypecheck.nantrace.options import RunSettings
from dtypecheck.nantrace.report import NanTraceReport
from dtypecheck.progress import ProgressCallback
from dtypecheck.training_step import as_call, to_device
from dtypecheck.usercode import load_factory

if TYPE_CHECKING:
    import torch
    from torch import nn

    from dtypecheck.nantrace.distributed import Session


@contextlib.contextmanager
def autocast(settings: RunSettings) -> Iterator[None]:
    """``torch.autocast`` to ``settings.autocast`` on the run's device type; nothing when no autocast is asked."""
    import torch

    if settings.autocast is None:
        yield
        return
    device_type = torch.device(settings.device or "cpu").type
    with torch.autocast(device_type=device_type, dtype=getattr(torch, settings.autocast)):
        yield


@contextlib.contextmanager
def as_main(path: Path, argv: list[str], settings: RunSettings, *, stdout: TextIO | None) -> Iterator[None]:
    """Run the block as ``path`` would run as ``__main__``: its argv, its directory first on ``sys.path``, the run's
    device and autocast, and its prints sent to ``stdout`` when given. Everything is put back on the way out,
    the working directory too: a script that changes directory must not move the report's file names.

    The tracer or watcher is entered inside this block, so it sees the script under the same device and autocast.
    The caller checks the file first (``check_python_file``), before it starts watching: a missing script is bad
    input, not the user's exception."""
    import torch

    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    saved_cwd = Path.cwd()
    sys.argv = [str(path), *argv]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        with contextlib.ExitStack() as stack:
            if stdout is not None:
                stack.enter_context(contextlib.redirect_stdout(stdout))
            if settings.device is not None:
                stack.enter_context(torch.device(settings.device))
            stack.enter_context(autocast(settings))
            yield
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        if saved_path0 is not None and sys.path and sys.path[0] == str(path.resolve().parent):
            sys.path.pop(0)


def run_main(path: Path) -> dict[str, Any]:
    """Execute ``path`` as ``__main__`` (inside ``as_main``); its namespace, which the caller decides when to free."""
    return runpy.run_path(str(path), run_name="__main__")


def release(namespace: dict[str, Any], session: Session | None) -> None:
    """Free what the script still held at its end, unless this process is a rank of a distributed run: freeing a
    sharded model under a collective still in flight crashes the process, so a rank keeps it to the end."""
    if session is None:
        namespace.clear()
    else:
        session.held.append(namespace)


class Reporting(Protocol):
    """What watched the run, a ``Tracer`` or a ``Watcher``."""

    def report(self, **extra: Any) -> NanTraceReport: ...


def finished(watch: Reporting, settings: RunSettings, source: str, **extra: Any) -> NanTraceReport:
    """The run's report, saying what ran (``source``) and under which autocast and device."""
    return watch.report(source=source, autocast=settings.autocast, device=settings.device, **extra)


def default_loss(inputs: Any) -> Callable[[Any], torch.Tensor]:
    """nan-trace's loss of a factory that gives none: the rule estimate-memory uses (``training_step.DefaultLoss``:
    the model's own loss, else cross-entropy over the last dimension for integer inputs and float logits, else MSE
    against zeros), taken in float32 so that the loss itself cannot overflow where the model did not."""
    import torch
    from torch.utils._pytree import tree_map

    from dtypecheck.training_step import DefaultLoss

    rule = DefaultLoss()

    def loss(output: Any) -> torch.Tensor:
        widened = tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, output)
        return rule(widened, inputs)

    return loss


@dataclass
class FactoryTraining:
    """A factory's model on the run's device, its inputs, its loss and an SGD optimizer: one ``step()`` at a time."""

    model: nn.Module
    inputs: Any
    loss_fn: Callable[[Any], Any]
    """The factory's ``loss_fn(output)``, else ``default_loss(inputs)``."""
    optimizer: torch.optim.Optimizer
    settings: RunSettings
    done: int = 0
    """The step running now, or the last one run: a run stopped inside step n has done n."""

    @classmethod
    def load(cls, path: Path, name: str, settings: RunSettings) -> FactoryTraining:
        import torch

        made = load_factory(f"{path}:{name}")
        if made.inputs is None:
            raise InputError(f"{path}:{name}() must return (model, inputs) or (model, inputs, loss_fn) for nan-trace")
        model = getattr(made.model, "_orig_mod", made.model)  # an already-compiled model runs its original eagerly
        device = torch.device(settings.device or "cpu")
        model = model.to(device)
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:  # torch.optim would raise "optimizer got an empty parameter list"
            raise InputError(
                f"{path}:{name}(): the model has no parameter that requires grad, and factory mode trains it "
                "(forward, backward, SGD step); trace a script that runs it instead"
            )
        optimizer = torch.optim.SGD(trainable, lr=1e-3)
        inputs = to_device(made.inputs, device)
        loss_fn = made.loss_fn if made.loss_fn is not None else default_loss(inputs)
        return cls(model, inputs, loss_fn, optimizer, settings)

    def step(self) -> None:
        """zero_grad, forward and loss under the run's autocast, backward, SGD step."""
        self.optimizer.zero_grad()
        args, kwargs = as_call(self.inputs)
        with autocast(self.settings):
            output = self.model(*args, **kwargs)
            loss = self.loss_fn(output)
        loss.backward()
        self.optimizer.step()

    def train(self, steps: int, progress: ProgressCallback) -> None:
        """``steps`` steps, each reported to ``progress`` as it ends."""
        for step in range(1, steps + 1):
            self.done = step
            self.step()
            progress(step, steps, f"step {step}/{steps}")
