"""The command line: parse options, call the core, render, return an exit code. No maths here."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any

import typer

from dtypecheck.cli import info as _info  # noqa: F401  (registers the command)
from dtypecheck.cli import memory as _memory  # noqa: F401  (registers the command)
from dtypecheck.cli import nantrace as _nantrace  # noqa: F401  (registers the command)
from dtypecheck.cli import scan as _scan  # noqa: F401  (registers the command)
from dtypecheck.cli._app import SPEAKER, USER_CODE, app, end_if_forked_child
from dtypecheck.errors import ExitCode, UserCodeError, describe
from dtypecheck.render.cells import printable


def _click_exception_type() -> type[Exception]:
    # Typer re-exports click's BadParameter (vendored in recent Typer, imported in older); its base
    # ClickException is what every usage error derives from, whichever click is underneath.
    for base in typer.BadParameter.__mro__:
        if base.__name__ == "ClickException":
            return base
    return typer.BadParameter


def _wants_traceback(argv: list[str]) -> bool:
    return "--traceback" in argv or os.environ.get("DTYPECHECK_TRACEBACK", "") not in ("", "0")


def main(argv: list[str] | None = None) -> int:
    """Entry point: the one error boundary mapping errors to one stderr line and the contract's exit codes.

    Every message goes through ``printable``: a file or tensor name holding a newline or a terminal escape cannot
    forge a second ``error:`` line or drive the terminal. Ctrl-C ends with ``error: interrupted`` and exit 130.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    click_exception = _click_exception_type()
    interrupted: list[int] = []
    previous = _watch_interrupts(interrupted)
    try:
        result = app(args=args, prog_name="dtypecheck", standalone_mode=False)
    except click_exception as exc:
        message = exc.format_message()  # type: ignore[attr-defined]
        if type(exc).__name__ == "NoArgsIsHelpError":
            # `dtypecheck` alone: the help is the answer. Rich has printed it already (the message is then empty,
            # which made an empty "error:" line); click's plain layout hands it back instead.
            if message.strip():
                print(message)
            return int(ExitCode.USAGE)
        _error(f"{message} (see 'dtypecheck --help')")
        return int(getattr(exc, "exit_code", ExitCode.USAGE))
    except typer.Exit as exc:
        result = int(exc.exit_code)
    except typer.Abort:
        _error("aborted")
        return INTERRUPTED
    except KeyboardInterrupt:
        interrupted.append(signal.SIGINT)
    except Exception as exc:
        mapped = describe(exc)
        # The user's code raised: with --traceback, its own frames (dtypecheck's would bury them), else one line.
        users = exc if isinstance(exc, UserCodeError) and exc.formatted else None
        if mapped is None or (_wants_traceback(args) and users is None):
            raise
        code, message = mapped
        end_if_forked_child(int(code))
        if users is not None and _wants_traceback(args):
            sys.stderr.write(users.formatted)
            message = users.message(traceback_shown=True)
        _error(message)
        return int(code)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if interrupted:  # typer turns Ctrl-C into a silent Exit(130): say so
        _error("interrupted")
        return INTERRUPTED
    return int(result) if isinstance(result, int) else int(ExitCode.OK)


INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT, the shell's convention), with ``error: interrupted`` on stderr."""


def _error(message: str) -> None:
    # One write: the ranks of a distributed run share the terminal, and print() writes a line and its end apart.
    where = "".join(f"{who}: " for who in SPEAKER)
    sys.stderr.write(f"error: {where}{printable(message)}\n")
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()


def _watch_interrupts(record: list[int]) -> Any:
    """Note every SIGINT in ``record`` and raise ``KeyboardInterrupt`` as Python does; the previous handler, or
    None when signals cannot be handled here (not the main thread)."""

    def on_interrupt(signum: int, _frame: object) -> None:
        record.append(signum)
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGINT, on_interrupt)
    except (ValueError, OSError):
        return None


def run() -> None:
    """Console entry point: ``main()``, then a fast exit when no user code ran in this process.

    Tearing down an interpreter that has loaded torch, numba and llvmlite takes ~0.5 s here, more than scanning
    4 GiB; dtypecheck's own outputs are complete by now (``--output`` is written, fsynced and renamed), so only
    the standard streams need flushing. A user's script or factory may have left files open that only the normal
    shutdown flushes: then we exit the normal way.
    """
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`): nothing more can be delivered
            stream.flush()
    if USER_CODE and not _threads_left_running():
        raise SystemExit(code)
    os._exit(code)


THREAD_GRACE_S = 2.0
"""How long the CLI waits, after its report is out, for threads the user's code left running."""


def _threads_left_running() -> bool:
    """Whether the user's code left non-daemon threads that would keep the interpreter from exiting; after a short
    grace period the CLI then exits without waiting for them (a note on stderr says so)."""
    import time

    deadline = time.monotonic() + THREAD_GRACE_S
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if left:
        with contextlib.suppress(OSError, ValueError):
            print(f"note: the user's code left {len(left)} thread(s) running; exiting without them", file=sys.stderr)
            sys.stderr.flush()
        import atexit

        atexit._run_exitfuncs()  # what a normal exit would still have done (logging handlers flush, ...)
    return bool(left)


__all__ = ["app", "main", "run"]
