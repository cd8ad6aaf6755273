"""``nan-trace --watch``: the script or factory run under a ``Watcher`` instead of a full ``Tracer``."""

from __future__ import annotations

import contextlib
import dataclasses
import runpy
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from dtypecheck.errors import InputError, UserCodeError
from dtypecheck.nantrace.options import RunSettings
from dtypecheck.nantrace.report import NanTraceReport
from dtypecheck.nantrace.runner import _autocast, _default_loss, _to_device
from dtypecheck.nantrace.tracer import StopTracing
from dtypecheck.nantrace.watch.watcher import Watcher
from dtypecheck.progress import ProgressCallback, no_progress
from dtypecheck.usercode import check_python_file, load_factory, raise_user_error

if TYPE_CHECKING:
    from dtypecheck.nantrace.distributed import Session
    from dtypecheck.nantrace.tracer import Tracer


def _stop() -> None:
    raise StopTracing


def _finish(watcher: Watcher, settings: RunSettings, source: str, **extra: Any) -> NanTraceReport:
    return watcher.report(source=source, autocast=settings.autocast, device=settings.device, **extra)


def run_script_watched(
    path: Path,
    argv: list[str],
    settings: RunSettings,
    *,
    stdout: TextIO | None = None,
    session: Session | None = None,
) -> NanTraceReport:
    """``runner.run_script`` in watch mode: the script runs as ``__main__``, the first non-finite step ends it."""
    import torch

    check_python_file(path)
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [str(path), *argv]
    sys.path.insert(0, str(path.resolve().parent))
    watcher = Watcher(dataclasses.replace(settings.options, restore_default_dtype=True), on_found=_stop)
    if session is not None:
        # The session only calls interrupt() on what it watches, which a Watcher has as a Tracer does.
        session.attach(cast("Tracer", watcher), lambda: _finish(watcher, settings, str(path)))
    namespace: dict[str, Any] = {}
    try:
        with contextlib.ExitStack() as stack:
            if stdout is not None:
                stack.enter_context(contextlib.redirect_stdout(stdout))
            if settings.device is not None:
                stack.enter_context(torch.device(settings.device))
            stack.enter_context(_autocast(settings))
            stack.enter_context(watcher)
            namespace = runpy.run_path(str(path), run_name="__main__")
    except StopTracing:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise UserCodeError(f"{path.name} exited with status {exc.code}") from None
    except Exception as exc:  # noqa: BLE001  (the user's own exception becomes exit 3 with their traceback)
        raise_user_error(exc, path.name, path)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] == str(path.resolve().parent):
            sys.path.pop(0)
        if session is None:
            namespace.clear()
        else:
            session.held.append(namespace)
    return _finish(watcher, settings, str(path))


def run_factory_watched(
    path: Path, name: str, steps: int, settings: RunSettings, *, progress: ProgressCallback = no_progress
) -> NanTraceReport:
    """``runner.run_factory`` in watch mode: ``steps`` forward + backward + SGD steps of the factory's model."""
    import torch

    made = load_factory(f"{path}:{name}")
    model, inputs, loss_fn = made.model, made.inputs, made.loss_fn
    if inputs is None:
        raise InputError(f"{path}:{name}() must return (model, inputs) or (model, inputs, loss_fn) for nan-trace")
    model = getattr(model, "_orig_mod", model)
    device = torch.device(settings.device or "cpu")
    model = model.to(device)
    inputs = _to_device(inputs, device)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    watcher = Watcher(dataclasses.replace(settings.options, restore_default_dtype=True), model=model, on_found=_stop)
    try:
        with watcher:
            for done in range(1, steps + 1):
                optimizer.zero_grad()
                with _autocast(settings):
                    if isinstance(inputs, dict):
                        output = model(**inputs)
                    elif isinstance(inputs, tuple | list):
                        output = model(*inputs)
                    else:
                        output = model(inputs)
                    loss = loss_fn(output) if loss_fn is not None else _default_loss(output)
                loss.backward()
                optimizer.step()
                progress(done, steps, f"step {done}/{steps}")
    except StopTracing:
        pass
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise_user_error(exc, f"{name}'s model", path)
    return _finish(watcher, settings, f"{path}:{name}")
