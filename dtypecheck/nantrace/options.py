"""What a trace is asked to do, with every default written once: the CLI's help text, the project config and
``dtypecheck.trace()`` read them from here. Light on purpose (no torch), so that ``--help`` stays instant."""

from __future__ import annotations

from dataclasses import dataclass, field

AUTOCAST_DTYPES = ("float16", "bfloat16")
"""The dtypes ``autocast`` may name."""


@dataclass(frozen=True)
class TraceOptions:
    keep_going: bool = False
    """Collect every producer instead of stopping at the first."""
    history: int = 20
    """Checked ops kept before each event."""
    warn_frac: float = 0.5
    """``near_overflow`` when an op's absmax reaches this fraction of its dtype's max."""
    window: int = 512
    """Ops between read-backs of the cheap reductions."""
    held_bytes: int = 512 << 20
    """Read back sooner once the window keeps this much alive (outputs, pre-op copies of in-place targets), so
    that deferring the checks never costs a large model much memory."""
    stop_run: bool = False
    """Raise ``StopTracing`` into the traced code at the first event (the CLI runners); the Python API just stops
    checking and lets the block finish."""
    restore_default_dtype: bool = False
    """Put back the default dtype tracing began with (the CLI runners: a script run in-process must not leave its
    ``set_default_dtype`` behind); the Python API leaves the user's choice in place."""
    max_skipped_steps: int = 16
    """GradScaler skipping this many consecutive steps (its scale shrinking each time) is a failure."""
    rank: int | None = None
    """This process's rank in a distributed run (written into its events)."""


@dataclass(frozen=True)
class RunSettings:
    """How the user's code is run under tracing (``runner.run_script``, ``runner.run_factory``)."""

    options: TraceOptions = field(default_factory=TraceOptions)
    autocast: str | None = None
    """``float16`` or ``bfloat16``: run under ``torch.autocast`` in that dtype."""
    device: str | None = None
    steps: int = 3
    """Factory mode: forward + backward + SGD steps to run (a script runs its own loop)."""
    watch: bool = False
    """``--watch``: cheap checks each step, full tracing of the step that failed (a ``Watcher``, not a ``Tracer``)."""
    optimizer_snapshot: bool = True
    """Watch mode copies the parameters and optimizer state before each update, to replay a NaN born inside it."""
