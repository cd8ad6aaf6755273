"""The command line: parse options, call the core, render, return an exit code. No maths here."""

from __future__ import annotations

import contextlib
import os
import sys

import typer

from dtypecheck.cli import info as _info  # noqa: F401  (registers the command)
from dtypecheck.cli import memory as _memory  # noqa: F401  (registers the command)
from dtypecheck.cli import nantrace as _nantrace  # noqa: F401  (registers the command)
from dtypecheck.cli import scan as _scan  # noqa: F401  (registers the command)
from dtypecheck.cli._app import USER_CODE, app
from dtypecheck.errors import ExitCode, UserCodeError, describe


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
    """Entry point: the one error boundary mapping errors to one stderr line and the contract's exit codes."""
    args = list(sys.argv[1:] if argv is None else argv)
    click_exception = _click_exception_type()
    try:
        result = app(args=args, prog_name="dtypecheck", standalone_mode=False)
    except click_exception as exc:
        message = exc.format_message()  # type: ignore[attr-defined]
        print(f"error: {message} (see 'dtypecheck --help')", file=sys.stderr)
        return int(getattr(exc, "exit_code", ExitCode.USAGE))
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        mapped = describe(exc)
        if mapped is None or _wants_traceback(args):
            raise
        code, message = mapped
        if isinstance(exc, UserCodeError) and exc.formatted:
            sys.stderr.write(exc.formatted)
        print(f"error: {message}", file=sys.stderr)
        return int(code)
    return int(result) if isinstance(result, int) else int(ExitCode.OK)


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
    if USER_CODE:
        raise SystemExit(code)
    os._exit(code)


__all__ = ["app", "main", "run"]
