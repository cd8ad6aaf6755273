"""``estimate_memory``: everything ``dtypecheck estimate-memory`` does, in one call: read the model (``open_subject``
dispatches to a factory, a config or a checkpoint), estimate every row, and with ``fit`` and ``measure`` add each
row's fit on a device and real steps beside the estimate."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from dtypecheck.errors import InputError, ParameterError
from dtypecheck.memory.config_models import open_hf_config
from dtypecheck.memory.devices import DeviceBudget, default_device, parse_fit
from dtypecheck.memory.estimate import EstimateOptions, estimate_with_traces, fixed_host_random, frozen_model_options
from dtypecheck.memory.fit import DEFAULT_FIT_TIMEOUT
from dtypecheck.memory.subject import Subject, load_checkpoint, open_factory
from dtypecheck.memory_words import DeviceKind, Mode
from dtypecheck.progress import ProgressCallback, no_progress
from dtypecheck.usercode import python_target

if TYPE_CHECKING:
    from dtypecheck.memory.report import MemoryReport
    from dtypecheck.training_step import LossName


def resolve_device(device: DeviceKind | str | None, budget: DeviceBudget | None) -> DeviceKind:
    """The device named, else CUDA when the fit target is a GPU or this machine has one, else the CPU."""
    if device is not None:
        return DeviceKind(device)
    if budget is not None and budget.accelerator:
        return DeviceKind.cuda
    return DeviceKind(default_device())


def estimate_memory(
    model: str | Subject,
    options: EstimateOptions | None = None,
    progress: ProgressCallback = no_progress,
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    loss: LossName | str | None = None,
    fit: str | DeviceBudget | None = None,
    reserve: str | None = None,
    fit_timeout: float | None = DEFAULT_FIT_TIMEOUT,
    measure: bool = False,
    fit_workers: int | None = None,
) -> MemoryReport:
    """What ``model`` needs per device, for every row ``options`` asks for; nothing is allocated unless ``measure``.

    ``model`` is ``file.py:factory``, a checkpoint file or folder, a ``config.json`` (or a folder with one), or a
    ``Subject`` already opened by ``open_subject`` (then ``batch_size``, ``seq_len`` and ``loss`` were given
    there). ``fit`` is a device name (``h100-80gb``) or a size (``80GiB``), ``reserve`` what of it is held back,
    ``fit_timeout`` the seconds its search may take (None: no bound) before it reports the bounds found so far,
    ``fit_workers`` the processes its traces are shared among (None: one per core; the answers do not change);
    ``measure`` runs one real step of every float row and puts the first training one in ``measured``.
    """
    with fixed_host_random(None):  # the caller's random states as they were, whatever the model's code drew
        options = options or EstimateOptions()
        if fit_timeout is not None and fit_timeout <= 0:
            raise ParameterError(f"{{fit_timeout}} must be a positive number of seconds, not {fit_timeout}")
        budget = parse_fit(fit, reserve) if isinstance(fit, str) else fit
        options = dataclasses.replace(options, device=resolve_device(options.device, budget))
        progress(0, 1, "reading the model")
        if isinstance(model, Subject):
            if batch_size is not None or seq_len is not None or loss is not None:
                raise ParameterError("{batch_size}, {seq_len} and {loss} are given to open_subject, with the model")
            subject = model
        else:
            subject = open_subject(model, batch_size=batch_size, seq_len=seq_len, loss=loss)
        options, frozen = frozen_model_options(subject, options)  # --fit and the breakdown plan the same rows
        report, traces = estimate_with_traces(subject, options, progress)
        if frozen is not None:
            report = dataclasses.replace(report, skipped=(frozen, *report.skipped))
        if options.by_module is not None or options.step_timeline:
            from dtypecheck.memory.breakdown import with_breakdowns

            report = with_breakdowns(subject, options, report, traces)
        if budget is not None:
            from dtypecheck.memory.fit import fit_report

            report = fit_report(subject, options, report, budget, progress, fit_timeout, traces, fit_workers)
        if measure:
            from dtypecheck.memory.measure import measure_rows

            progress(0, 1, "measuring real steps")
            measurements, unmeasured = measure_rows(subject, report.estimates)
            # The headline is a training step when one ran: it is the peak users size a device for.
            trained = [m for m in measurements if m.mode == Mode.training] or list(measurements)
            report = dataclasses.replace(
                report, measured=trained[0], measurements=measurements, skipped=(*report.skipped, *unmeasured)
            )
        return report


def open_subject(
    target: str, *, batch_size: int | None = None, seq_len: int | None = None, loss: LossName | str | None = None
) -> Subject:
    """Dispatch on what ``target`` is: a factory spec, a config, or a checkpoint."""
    if python_target(target) is not None:
        if seq_len is not None:
            raise ParameterError("{seq_len} applies to a config's inputs; a factory gives its own example inputs")
        return open_factory(target, batch_size=batch_size, loss=loss)
    path = Path(target)
    if not path.exists():
        from dtypecheck.loaders.hub import resolve_hub_config  # only for a path that does not exist

        hub_config = resolve_hub_config(target)
        if hub_config is None:
            raise InputError(f"no such file or directory: {target}")
        return open_hf_config(hub_config, batch_size=batch_size, seq_len=seq_len, loss=loss)
    if path.is_dir() and (path / "config.json").is_file():
        return open_hf_config(path / "config.json", batch_size=batch_size, seq_len=seq_len, loss=loss)
    if path.is_file() and path.name.endswith(".json") and not path.name.endswith(".index.json"):
        return open_hf_config(path, batch_size=batch_size, seq_len=seq_len, loss=loss)
    if batch_size is not None or seq_len is not None or loss is not None:
        raise ParameterError(
            "{batch_size}, {seq_len} and {loss} need a factory or a config: a checkpoint has no forward pass"
        )
    return load_checkpoint(target)
