"""What both callbacks share: a ``Watcher`` run across a trainer's fit, its report written as JSON, one log line."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar

from dtypecheck.errors import UsageError
from dtypecheck.nantrace.options import TraceOptions

if TYPE_CHECKING:
    from torch import nn

    from dtypecheck.nantrace.report import NanTraceReport
    from dtypecheck.nantrace.watch import Watcher

LOG = logging.getLogger("dtypecheck")


class UnsupportedFrameworkError(UsageError):
    """A callback was set up with a framework version it was not built for."""


class ReportPathError(UsageError):
    """A callback was given a report path it cannot write: said when it is built, not at the failing step."""


def prepare_report_path(path: Path) -> None:
    """Create the report's folder now and check that a file can be written there, so that neither a missing
    folder nor a read-only one surfaces at the step that went non-finite, where the trainer would die of it and
    the finding be lost."""
    problem = f"NanTraceCallback cannot write its report to {path}"
    if path.is_dir():
        raise ReportPathError(f"{problem}: it is a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ReportPathError(f"{problem}: cannot create {path.parent}: {error.strerror or error}") from error
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ReportPathError(f"{problem}: {path.parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise ReportPathError(f"{problem}: the file is read-only")


def _release(version: str) -> tuple[int, ...]:
    """``"4.57.1"`` -> (4, 57, 1); ``"2.6.0rc1"`` -> (2, 6, 0); the leading numbers only."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.end() != len(part):
            break
    return tuple(numbers)


def require_version(framework: str, installed: str, minimum: tuple[int, ...], below: tuple[int, ...]) -> None:
    """One clear error when the callback is built, rather than a broken hook mid-run."""
    found = _release(installed)
    if not found or not minimum <= found < below:
        wanted = f">={'.'.join(map(str, minimum))},<{'.'.join(map(str, below))}"
        raise UnsupportedFrameworkError(
            f"dtypecheck's {framework} callback supports {framework} {wanted}; this is {framework} {installed}"
        )


_DETECTED = {
    "loss": "the loss",
    "gradients": "the gradients",
    "optimizer_step": "the optimizer's update",
    "scale_collapse": "GradScaler's scale",
    "held_tensors": "a held parameter or buffer",
}
"""``WatchSummary.detected`` in words."""


def log_line(report: NanTraceReport, path: Path | None) -> str:
    """``dtypecheck nan-trace: step 7: inf born in aten.exp.default (forward) in module block at train.py:13``."""
    first = report.first
    where = f" (report: {path})" if path is not None else ""
    if first is None:
        if report.scale_collapse is not None:
            return (
                f"dtypecheck nan-trace: GradScaler's scale collapsed by step {report.scale_collapse.last_step}{where}"
            )
        return f"dtypecheck nan-trace: clean over {report.steps} step(s){where}"
    module = "outside every module" if first.module is None else f"in module {first.module or '(model)'}"
    line = f" at {first.location.file}:{first.location.line}" if first.location is not None else ""
    if first.cause == "input":
        # The op only read a value that was already non-finite (a parameter an earlier update wrote, the batch):
        # "born in" would send the reader to a line that did nothing wrong.
        born = f"{first.kind} already in the input of {first.op} ({first.phase})"
    else:
        born = f"{first.kind} born in {first.op} ({first.phase})"
    found = f"step {first.step}: {born} {module}{line}"
    watch = report.watch
    if watch is not None and watch.exact is False and watch.detected_step not in (None, first.step):
        # The step that went non-finite could not be replayed; what follows is only the first value the fully
        # traced later steps saw, usually the earlier step's NaN coming back through the weights.
        found = (
            f"step {watch.detected_step}: {_DETECTED.get(watch.detected or '', 'a check')} went non-finite but the "
            f"step could not be replayed exactly (the report's watch.reason says why); the next steps, traced "
            f"fully: {found}"
        )
    return f"dtypecheck nan-trace: {found}{where}"


class WatchSession:
    """Started when training starts, polled at each step's end, finished when training ends."""

    def __init__(self, *, report_path: Path | str | None, stop: bool, history: int, optimizer_snapshot: bool) -> None:
        self.report_path = Path(report_path) if report_path is not None else None
        if self.report_path is not None:
            prepare_report_path(self.report_path)
        self.stop = stop
        self.history = history
        self.optimizer_snapshot = optimizer_snapshot
        self.watcher: Watcher | None = None
        self.found = False
        self.report: NanTraceReport | None = None

    def start(self, model: nn.Module | None, *, optimizer_seen: bool, names_from_calls: bool = False) -> None:
        """``names_from_calls``: module paths start at the module called outermost, as a full trace of the script
        names them (a LightningModule whose ``training_step`` calls ``self.net`` is not itself called), not at
        ``model``."""
        from dtypecheck.nantrace.watch import Watcher

        self.watcher = Watcher(
            TraceOptions(history=self.history),
            model=None if names_from_calls else model,
            optimizer_snapshot=self.optimizer_snapshot,
            on_found=self._found,
        )
        self.watcher.optimizer_seen = optimizer_seen
        self.watcher.__enter__()

    def _found(self) -> None:
        self.found = True

    def poll(self) -> bool:
        """At a step's end: whether the trainer should stop now."""
        if self.watcher is None:
            return False
        was = self.found
        self.watcher.poll()
        if self.found and not was:
            self._write(self.watcher.report())
        return self.found and self.stop

    def finish(self) -> NanTraceReport | None:
        watcher, self.watcher = self.watcher, None
        if watcher is None:
            return self.report
        watcher.__exit__(None, None, None)
        self._write(watcher.report(), log=self.report is None)  # a finding was logged when it was found
        return self.report

    def _write(self, report: NanTraceReport, *, log: bool = True) -> None:
        from dtypecheck.render import write_atomically
        from dtypecheck.render.json import render_json

        self.report = report
        written = self.report_path
        if written is not None:
            try:
                write_atomically(written, render_json(report))
            except OSError as error:  # the folder went away mid-run: say so, and keep the finding in the log
                LOG.error("dtypecheck nan-trace: could not write the report to %s: %s", written, error)
                written = None
        if not log:
            return
        message = log_line(report, written)
        if report.status == "clean":
            LOG.info(message)
        else:
            LOG.warning(message)


class WatchingCallback:
    """The half of a ``NanTraceCallback`` that does not depend on the framework: its arguments, the version check
    and the session. A framework's callback subclasses it with the framework's ``Callback`` base and maps that
    framework's hooks to ``session.start``, ``session.poll`` and ``session.finish``."""

    framework: ClassVar[ModuleType]
    """The framework's package (``transformers``, ``lightning``): its name and ``__version__``, read when built."""
    supported: ClassVar[tuple[tuple[int, ...], tuple[int, ...]]]
    """(minimum, below): the framework versions the callback is built for."""

    def __init__(
        self,
        report_path: Path | str | None = "dtypecheck-nantrace.json",
        *,
        stop: bool = True,
        history: int = TraceOptions.history,
        optimizer_snapshot: bool = True,
    ) -> None:
        require_version(self.framework.__name__, str(self.framework.__version__), *self.supported)
        self.session = WatchSession(
            report_path=report_path, stop=stop, history=history, optimizer_snapshot=optimizer_snapshot
        )

    @property
    def report(self) -> NanTraceReport | None:
        """The report once training ended (or once the failing step was found)."""
        return self.session.report
