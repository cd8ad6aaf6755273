"""Running the user's code under tracing: an unmodified script as ``__main__``, or a factory's model for N steps."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from dtypecheck.errors import InputError, UserCodeError
from dtypecheck.lazy_dynamo import defer_dynamo_import
from dtypecheck.nantrace.harness import FactoryTraining, as_main, finished, release, run_main
from dtypecheck.nantrace.options import RunSettings
from dtypecheck.nantrace.report import NanTraceReport
from dtypecheck.nantrace.tracer import StopTracing, Tracer
from dtypecheck.progress import ProgressCallback, no_progress
from dtypecheck.usercode import check_python_file, python_target, raise_user_error, user_traceback

if TYPE_CHECKING:
    from torch import nn

    from dtypecheck.nantrace.distributed import Session
    from dtypecheck.nantrace.watch.watcher import Watcher


def split_target(target: str) -> tuple[Path, str | None]:
    """``train.py`` -> (train.py, None); ``file.py:factory`` -> (file.py, "factory"); a script of any name runs."""
    return python_target(target) or (Path(target), None)


def run_script(
    path: Path,
    argv: list[str],
    settings: RunSettings,
    *,
    stdout: TextIO | None = None,
    session: Session | None = None,
) -> NanTraceReport:
    """Run ``path`` as ``__main__`` with ``argv`` under tracing (watched with ``settings.watch``); its prints go to
    ``stdout`` when given.

    ``session``: this process is one rank of a distributed run (``distributed.Session``)."""
    check_python_file(path)
    tracer = _tracer(settings)
    if session is not None:
        # The session only calls interrupt() on what it watches, which a Watcher has as a Tracer does.
        session.attach(cast("Tracer", tracer), lambda: finished(tracer, settings, str(path)))
    failure: dict[str, Any] = {}
    namespace: dict[str, Any] = {}
    try:
        with as_main(path, argv, settings, stdout=stdout), tracer:
            # Held until tracing ends: what the script still holds when it ends is its output.
            namespace = run_main(path)
    except StopTracing:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0) and not _found_nonfinite(tracer):
            if isinstance(exc.code, int):
                raise UserCodeError(f"{path.name} exited with status {exc.code}") from None
            # sys.exit("message"): Python prints the message and exits 1 ("exited with status fatal: ..." before)
            raise UserCodeError(f"{path.name} exited with status 1: sys.exit({exc.code!r})") from None
    except Exception as exc:  # noqa: BLE001  (the user's own exception becomes exit 3 with their traceback)
        failure = _failure(tracer, exc, path.name, path)
    finally:
        release(namespace, session)
    return finished(tracer, settings, str(path), **failure)


def run_factory(
    path: Path, name: str, steps: int, settings: RunSettings, *, progress: ProgressCallback = no_progress
) -> NanTraceReport:
    """Run ``steps`` forward + backward + SGD steps of the factory's model under tracing (watched with
    ``settings.watch``)."""
    training = FactoryTraining.load(path, name, settings)
    tracer = _tracer(settings, training.model)
    failure: dict[str, Any] = {}
    try:
        with tracer:
            training.train(steps, progress)
    except StopTracing:
        pass
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001
        failure = _failure(tracer, exc, f"{name}'s model", path)
    if isinstance(tracer, Tracer):
        failure = {"steps": training.done, **failure}  # a watcher counts the steps it checked itself
    return finished(tracer, settings, f"{path}:{name}", **failure)


def _stop() -> None:
    raise StopTracing


def _tracer(settings: RunSettings, model: nn.Module | None = None) -> Tracer | Watcher:
    """A full ``Tracer`` that stops the run at the first finding, or with ``settings.watch`` a ``Watcher`` that
    ends it once the failing step is replayed."""
    # The traced code's first optimizer would import torch._dynamo (~1.5 s of CPU, a third of a small run), which
    # it uses only to compile: a stand-in serves until something does (``lazy_dynamo``).
    defer_dynamo_import()
    options = dataclasses.replace(settings.options, restore_default_dtype=True)
    if settings.watch:
        from dtypecheck.nantrace.watch.watcher import Watcher

        return Watcher(options, model=model, on_found=_stop, optimizer_snapshot=settings.optimizer_snapshot)
    names = None if model is None else {id(m): n for n, m in model.named_modules()}
    return Tracer(dataclasses.replace(options, stop_run=True), module_names=names, model=model)


def _found_nonfinite(tracer: Tracer | Watcher) -> bool:
    """A full trace that already found a non-finite producer reports the script's exception as its consequence
    (exit 1); watch mode ends the run at its finding, so an exception there is the user's own (exit 3)."""
    return isinstance(tracer, Tracer) and tracer.found_nonfinite


def _failure(tracer: Tracer | Watcher, exc: Exception, what: str, user_file: Path) -> dict[str, Any]:
    """The report arguments after the traced code raised ``exc``: none after a non-finite producer (the exception
    is its consequence), an explained dtype mismatch under a full trace, else exit 3 with the user's traceback."""
    if _found_nonfinite(tracer):
        return {}
    if not isinstance(tracer, Tracer):  # watch mode does not explain dtype mismatches
        raise_user_error(exc, what, user_file)
    return _dtype_failure_or_raise(tracer, exc, what, user_file)


def _dtype_failure_or_raise(tracer: Tracer, exc: BaseException, what: str, user_file: Path) -> dict[str, Any]:
    """The report arguments for a dtype mismatch tracing can explain; any other exception exits 3 as before.

    The explained report is returned (not raised) so that the CLI can still write the document, then exit 3.
    """
    from dtypecheck.nantrace.explain import is_dtype_error

    if not is_dtype_error(exc):
        raise_user_error(exc, what, user_file)
    import torch

    # The explanation names the op and the module: torch's own frames would only bury the user's lines.
    formatted = user_traceback(exc, user_file, without=(str(Path(torch.__file__).parent),))
    probe = tracer.report(failure=exc, failure_traceback=formatted)
    if probe.dtype_error is None:
        raise_user_error(exc, what, user_file)
    return {"dtype_error": probe.dtype_error, "status": probe.status}
