"""``TracerHooks``: what the training-loop watch (``training.py``), the ``torch.compile`` patch (``eager.py``)
and the DataLoader worker watch (``workers.py``) may call on the tracer.

They are installed by the tracer and call back into it; typing them against this protocol rather than the
``Tracer`` class keeps the tracer the only module that knows them both (no import circle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dtypecheck.nantrace.judge import Judge


class TracerHooks(Protocol):
    """The tracer, as the landmarks of a training loop see it."""

    compile_calls: int
    """``torch.compile`` calls seen (each runs its model eagerly)."""

    @property
    def stopped(self) -> bool:
        """Tracing has stopped (the first failure, or another rank's): landmarks no longer judge anything."""

    @property
    def judge(self) -> Judge:
        """Where reached values (the loss, parameters, optimizer states) are decided."""

    def flush(self) -> None:
        """Judge the ops still waiting in the window."""

    def judge_now(self) -> None:
        """Judge the ops still waiting in the window, never stopping the traced code (a DataLoader worker)."""

    def landmark_runs_ops(self) -> bool:
        """Whether judging at a landmark may run torch ops (which must then not be traced)."""

    def stop_if_failed(self) -> None:
        """End the traced code (``StopTracing``) when the judge has failed and the run stops at the first."""

    def step_ended(self) -> None:
        """A training step ended (its optimizer step, or its backward in code with no optimizer)."""

    def scaler_updated(self, skipped: bool, before: float, after: float) -> None:
        """A ``GradScaler.update``: ``skipped`` the step, its scale went from ``before`` to ``after``."""
