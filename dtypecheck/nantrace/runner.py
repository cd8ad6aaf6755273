"""Running the user's code under tracing: an unmodified script as ``__main__``, or a factory's model for N steps."""

from __future__ import annotations

import contextlib
import dataclasses
import runpy
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from dtypecheck.errors import InputError, UserCodeError
from dtypecheck.nantrace.report import NanTraceReport
from dtypecheck.nantrace.tracer import StopTracing, TraceOptions, Tracer
from dtypecheck.progress import ProgressCallback, no_progress
from dtypecheck.usercode import check_python_file, load_factory, python_target, raise_user_error, user_traceback

if TYPE_CHECKING:
    import torch

    from dtypecheck.nantrace.distributed import Session


@dataclass(frozen=True)
class RunSettings:
    options: TraceOptions
    autocast: str | None = None
    """``float16`` or ``bfloat16``: run under ``torch.autocast`` in that dtype."""
    device: str | None = None
    watch: bool = False
    """``--watch``: cheap checks each step, full tracing of the step that failed (``watch/run.py`` runs it)."""


def split_target(target: str) -> tuple[Path, str | None]:
    """``train.py`` -> (train.py, None); ``file.py:factory`` -> (file.py, "factory"); a script of any name runs."""
    return python_target(target) or (Path(target), None)


@contextlib.contextmanager
def _autocast(settings: RunSettings) -> Iterator[None]:
    import torch

    if settings.autocast is None:
        yield
        return
    device_type = torch.device(settings.device or "cpu").type
    with torch.autocast(device_type=device_type, dtype=getattr(torch, settings.autocast)):
        yield


def _finish(tracer: Tracer, settings: RunSettings, source: str, **extra: Any) -> NanTraceReport:
    return tracer.report(source=source, autocast=settings.autocast, device=settings.device, **extra)


def run_script(
    path: Path,
    argv: list[str],
    settings: RunSettings,
    *,
    stdout: TextIO | None = None,
    session: Session | None = None,
) -> NanTraceReport:
    """Run ``path`` as ``__main__`` with ``argv`` under tracing; its prints go to ``stdout`` when given.

    ``session``: this process is one rank of a distributed run (``distributed.Session``)."""
    import torch

    check_python_file(path)
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [str(path), *argv]
    sys.path.insert(0, str(path.resolve().parent))
    tracer = Tracer(dataclasses.replace(settings.options, stop_run=True, restore_default_dtype=True))
    if session is not None:
        session.attach(tracer, lambda: _finish(tracer, settings, str(path)))
    failure: dict[str, Any] = {}
    namespace: dict[str, Any] = {}
    try:
        with contextlib.ExitStack() as stack:
            if stdout is not None:
                stack.enter_context(contextlib.redirect_stdout(stdout))
            if settings.device is not None:
                stack.enter_context(torch.device(settings.device))
            stack.enter_context(_autocast(settings))
            stack.enter_context(tracer)
            # Held until tracing ends: what the script still holds when it ends is its output.
            namespace = runpy.run_path(str(path), run_name="__main__")
    except StopTracing:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise UserCodeError(f"{path.name} exited with status {exc.code}") from None
    except Exception as exc:  # noqa: BLE001  (the user's own exception becomes exit 3 with their traceback)
        failure = _dtype_failure_or_raise(tracer, exc, path.name, path)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] == str(path.resolve().parent):
            sys.path.pop(0)
        if session is None:
            namespace.clear()
        else:
            # Freeing a sharded model under a collective still in flight crashes the process: keep it to the end.
            session.held.append(namespace)
    return _finish(tracer, settings, str(path), **failure)


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


def _to_device(value: Any, device: torch.device) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_device(v, device) for v in value)
    return value


def _default_loss(output: Any) -> torch.Tensor:
    import torch

    tensor = output
    while not isinstance(tensor, torch.Tensor):
        if isinstance(tensor, dict) and tensor:
            tensor = next(iter(tensor.values()))
        elif isinstance(tensor, list | tuple) and tensor:
            tensor = tensor[0]
        else:
            raise InputError(f"the model returned {type(output).__name__} with no tensor; give a loss_fn")
    return tensor if tensor.dim() == 0 else tensor.float().pow(2).mean()


def run_factory(
    path: Path, name: str, steps: int, settings: RunSettings, *, progress: ProgressCallback = no_progress
) -> NanTraceReport:
    """Run ``steps`` forward + backward + SGD steps of the factory's model under tracing."""
    import torch

    made = load_factory(f"{path}:{name}")
    model, inputs, loss_fn = made.model, made.inputs, made.loss_fn
    if inputs is None:
        raise InputError(f"{path}:{name}() must return (model, inputs) or (model, inputs, loss_fn) for nan-trace")
    model = getattr(model, "_orig_mod", model)  # an already-compiled model runs its original eagerly
    device = torch.device(settings.device or "cpu")
    model = model.to(device)
    inputs = _to_device(inputs, device)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    names = {id(m): n for n, m in model.named_modules()}
    options = dataclasses.replace(settings.options, stop_run=True, restore_default_dtype=True)
    tracer = Tracer(options, module_names=names, model=model)
    done = 0
    failure: dict[str, Any] = {}
    try:
        with tracer:
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
        failure = _dtype_failure_or_raise(tracer, exc, f"{name}'s model", path)
    return _finish(tracer, settings, f"{path}:{name}", steps=done, **failure)
