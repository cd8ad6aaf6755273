"""Running the user's code under tracing: an unmodified script as ``__main__``, or a factory's model for N steps."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from dtypecheck.errors import InputError, UserCodeError
from dtypecheck.nantrace.harness import FactoryTraining, as_main, finished, release, run_main
from dtypecheck.nantrace.options import RunSettings
from dtypecheck.nantrace.report import NanTraceReport
from dtypecheck.nantrace.tracer import StopTracing, Tracer
from dtypecheck.progress import ProgressCallback, no_progress
from dtypecheck.usercode import check_python_file, python_target, raise_user_error, user_traceback

if TYPE_CHECKING:
    from dtypecheck.nantrace.distributed import Session


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
    """Run ``path`` as ``__main__`` with ``argv`` under tracing; its prints go to ``stdout`` when given.

    ``session``: this process is one rank of a distributed run (``distributed.Session``). With
    ``settings.watch`` the script runs watched (``watch.run``)."""
    if settings.watch:
        from dtypecheck.nantrace.watch.run import run_script_watched

        return run_script_watched(path, argv, settings, stdout=stdout, session=session)
    check_python_file(path)
    tracer = Tracer(dataclasses.replace(settings.options, stop_run=True, restore_default_dtype=True))
    if session is not None:
        session.attach(tracer, lambda: finished(tracer, settings, str(path)))
    failure: dict[str, Any] = {}
    namespace: dict[str, Any] = {}
    try:
        with as_main(path, argv, settings, stdout=stdout), tracer:
            # Held until tracing ends: what the script still holds when it ends is its output.
            namespace = run_main(path)
    except StopTracing:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0) and not tracer.found_nonfinite:
            raise UserCodeError(f"{path.name} exited with status {exc.code}") from None
    except Exception as exc:  # noqa: BLE001  (the user's own exception becomes exit 3 with their traceback)
        # After a non-finite producer the exception is its consequence (in the report): exit 1, not 3.
        if not tracer.found_nonfinite:
            failure = _dtype_failure_or_raise(tracer, exc, path.name, path)
    finally:
        release(namespace, session)
    return finished(tracer, settings, str(path), **failure)


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


def run_factory(
    path: Path, name: str, steps: int, settings: RunSettings, *, progress: ProgressCallback = no_progress
) -> NanTraceReport:
    """Run ``steps`` forward + backward + SGD steps of the factory's model under tracing (watched with
    ``settings.watch``)."""
    if settings.watch:
        from dtypecheck.nantrace.watch.run import run_factory_watched

        return run_factory_watched(path, name, steps, settings, progress=progress)
    training = FactoryTraining.load(path, name, settings)
    names = {id(m): n for n, m in training.model.named_modules()}
    options = dataclasses.replace(settings.options, stop_run=True, restore_default_dtype=True)
    tracer = Tracer(options, module_names=names, model=training.model)
    failure: dict[str, Any] = {}
    try:
        with tracer:
            training.train(steps, progress)
    except StopTracing:
        pass
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001
        if not tracer.found_nonfinite:
            failure = _dtype_failure_or_raise(tracer, exc, f"{name}'s model", path)
    return finished(tracer, settings, f"{path}:{name}", steps=training.done, **failure)
