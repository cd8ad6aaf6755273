"""``nan-trace --watch``: the script or factory run under a ``Watcher`` instead of a full ``Tracer``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from dtypecheck.errors import InputError, UserCodeError
from dtypecheck.nantrace.harness import FactoryTraining, as_main, finished, release, run_main
from dtypecheck.nantrace.options import RunSettings
from dtypecheck.nantrace.report import NanTraceReport
from dtypecheck.nantrace.tracer import StopTracing
from dtypecheck.nantrace.watch.watcher import Watcher
from dtypecheck.progress import ProgressCallback, no_progress
from dtypecheck.usercode import check_python_file, raise_user_error

if TYPE_CHECKING:
    from dtypecheck.nantrace.distributed import Session
    from dtypecheck.nantrace.tracer import Tracer


def _stop() -> None:
    raise StopTracing


def run_script_watched(
    path: Path,
    argv: list[str],
    settings: RunSettings,
    *,
    stdout: TextIO | None = None,
    session: Session | None = None,
) -> NanTraceReport:
    """``runner.run_script`` in watch mode: the script runs as ``__main__``, the first non-finite step ends it."""
    check_python_file(path)
    watcher = Watcher(
        dataclasses.replace(settings.options, restore_default_dtype=True),
        on_found=_stop,
        optimizer_snapshot=settings.optimizer_snapshot,
    )
    if session is not None:
        # The session only calls interrupt() on what it watches, which a Watcher has as a Tracer does.
        session.attach(cast("Tracer", watcher), lambda: finished(watcher, settings, str(path)))
    namespace: dict[str, Any] = {}
    try:
        with as_main(path, argv, settings, stdout=stdout), watcher:
            namespace = run_main(path)
    except StopTracing:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise UserCodeError(f"{path.name} exited with status {exc.code}") from None
    except Exception as exc:  # noqa: BLE001  (the user's own exception becomes exit 3 with their traceback)
        raise_user_error(exc, path.name, path)
    finally:
        release(namespace, session)
    return finished(watcher, settings, str(path))


def run_factory_watched(
    path: Path, name: str, steps: int, settings: RunSettings, *, progress: ProgressCallback = no_progress
) -> NanTraceReport:
    """``runner.run_factory`` in watch mode: ``steps`` forward + backward + SGD steps of the factory's model."""
    training = FactoryTraining.load(path, name, settings)
    options = dataclasses.replace(settings.options, restore_default_dtype=True)
    watcher = Watcher(options, model=training.model, on_found=_stop, optimizer_snapshot=settings.optimizer_snapshot)
    try:
        with watcher:
            training.train(steps, progress)
    except StopTracing:
        pass
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise_user_error(exc, f"{name}'s model", path)
    return finished(watcher, settings, f"{path}:{name}")
