"""``--by-module`` and ``--plot``: a row's bytes by module and over the step, from a pass traced whole."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from dtypecheck.memory import states
from dtypecheck.memory.estimate import EstimateOptions, Row, TraceCache, _shards, graded, plan_rows
from dtypecheck.memory.report import (
    MemoryEstimate,
    MemoryReport,
    ModuleBreakdown,
    ModuleMemory,
    PeakMoment,
    StepTimeline,
)
from dtypecheck.memory.tracing import ActivationProfile
from dtypecheck.memory_words import Mode

if TYPE_CHECKING:
    from dtypecheck.memory.inventory import Inventory, TensorEntry
    from dtypecheck.memory.subject import Subject

ROOT = "(root)"
OUTSIDE = "(outside modules)"
MAX_POINTS = 2000
"""The most moments a ``StepTimeline`` keeps (each the largest of its bucket, the peak always among them)."""


def _truncate(path: str | None, depth: int, root_name: str) -> str:
    if path is None:
        return OUTSIDE
    if path == root_name or not path:
        return ROOT
    return ".".join(path.split(".")[: max(depth, 1)])


def _owner(entry: TensorEntry, depth: int) -> str:
    """The module a parameter or buffer belongs to, at ``depth``: its name less the last component."""
    module, _, _ = entry.name.rpartition(".")
    return _truncate(module or None, depth, "") if module else ROOT


def apportion(parts: list[int], total: int) -> list[int]:
    """``parts`` scaled to sum to ``total`` exactly (cumulative rounding down): a sharded row's bytes by module."""
    whole = sum(parts)
    if whole == 0:
        return [0] * len(parts)
    shares, running, given = [], 0, 0
    for part in parts:
        running += part
        upto = running * total // whole
        shares.append(upto - given)
        given = upto
    return shares


def module_breakdown(
    subject: Subject,
    options: EstimateOptions,
    row: Row,
    estimate: MemoryEstimate,
    profile: ActivationProfile,
    depth: int,
) -> ModuleBreakdown:
    """``estimate`` by module at ``depth``: model states from the inventory (scaled to the row's per-device bytes),
    activations as held at the pass's peak moment."""
    assert profile.step is not None
    step = profile.step
    inventory = subject.inventory
    root_name = type(subject.traceable.module).__name__ if subject.traceable else ""
    order: list[str] = []
    params: dict[str, list[TensorEntry]] = {}
    buffers: dict[str, list[TensorEntry]] = {}
    for entry in inventory.parameters:
        params.setdefault(_owner(entry, depth), []).append(entry)
    for entry in inventory.buffers:
        buffers.setdefault(_owner(entry, depth), []).append(entry)
    held: dict[str, int] = {}
    for module, nbytes in step.held_by:
        key = _truncate(module, depth, root_name)
        held[key] = held.get(key, 0) + nbytes
    for key in [*params, *buffers, *held]:
        if key not in order:
            order.append(key)
    order.sort(key=lambda key: (key == OUTSIDE, key == ROOT))  # the model's modules first, in their own order

    training = row.mode == Mode.training
    spec, precision = row.spec, row.precision
    stepped = {entry.name: entry for entry in graded(inventory, profile, options.strategy).parameters}

    def sub(key: str, *, stepped_only: bool = False) -> Inventory:
        entries = params.get(key, ())
        if stepped_only:
            entries = [stepped[entry.name] for entry in entries]
        return dataclasses.replace(inventory, parameters=tuple(entries), buffers=())

    weights = apportion(
        [
            states.plan_weights(
                sub(k), spec, precision, keep_unquantized=options.keep_unquantized, group_size=options.group_size
            ).weight_bytes
            for k in order
        ],
        estimate.bytes.parameters,
    )
    buffer_bytes = [sum(b.nbytes for b in buffers.get(k, ())) for k in order]
    grads = [states.gradient_bytes(sub(k, stepped_only=True), spec, precision) if training else 0 for k in order]
    optim = [
        states.optimizer_state_bytes(sub(k, stepped_only=True), options.optimizer, spec, precision)
        + states.master_weight_bytes(sub(k), precision)
        if training
        else 0
        for k in order
    ]
    grads = apportion(grads, estimate.bytes.gradients)
    optim = apportion(optim, estimate.bytes.optimizer_states + estimate.bytes.master_weights)
    modules = tuple(
        ModuleMemory(
            module=key,
            parameters=sum(e.numel for e in params.get(key, ())),
            weight_bytes=weights[i],
            buffer_bytes=buffer_bytes[i],
            gradient_bytes=grads[i],
            optimizer_bytes=optim[i],
            activation_bytes=held.get(key, 0),
        )
        for i, key in enumerate(order)
    )
    index = step.peak_index
    activations, gradients = profile.timeline[index] if profile.timeline else (0, 0)
    backward = step.backward_from is not None and index >= step.backward_from
    peak = PeakMoment(
        op=step.ops[index] if step.ops else "",
        module=step.modules[index] if step.modules else None,
        phase="backward" if backward else "forward",
        index=index,
        ops=len(step.ops),
        activation_bytes=activations,
        gradient_bytes=gradients,
    )
    return ModuleBreakdown(estimate.dtype, estimate.mode, estimate.precision, depth, modules, peak)


def step_timeline(estimate: MemoryEstimate, profile: ActivationProfile, options: EstimateOptions) -> StepTimeline:
    """The row's bytes over the pass (and its optimizer step), at most ``MAX_POINTS`` moments."""
    assert profile.step is not None
    b = estimate.bytes
    training = estimate.mode == Mode.training
    _, grad_parts, _ = _shards(options.strategy, options.world_size)
    resident = b.parameters + b.buffers + b.optimizer_states + b.master_weights + b.gathered_parameters + b.kv_cache
    timeline = profile.timeline
    peak = profile.step.peak_index
    bucket = max(1, -(-len(timeline) // MAX_POINTS))
    moments = []
    for start in range(0, len(timeline), bucket):
        chunk = range(start, min(start + bucket, len(timeline)))
        best = peak if peak in chunk else max(chunk, key=lambda i: timeline[i][0] + timeline[i][1])
        activations, gradients = timeline[best]
        moments.append((best, activations, gradients // grad_parts))
    optimizer_step = (
        b.parameters
        + b.buffers
        + b.optimizer_states
        + b.master_weights
        + b.gradients
        + b.optimizer_step_transient
        + profile.retained_bytes
        if training
        else None
    )
    return StepTimeline(
        estimate.dtype,
        estimate.mode,
        estimate.precision,
        resident,
        tuple(moments),
        len(timeline),
        profile.step.backward_from,
        peak,
        optimizer_step,
        b.total,
    )


def with_breakdowns(
    subject: Subject, options: EstimateOptions, report: MemoryReport, traces: TraceCache
) -> MemoryReport:
    """``report`` with ``modules`` (``options.by_module``) and ``steps`` (``options.step_timeline``) of every row
    whose pass was traced whole with attribution."""
    rows, _ = plan_rows(options)
    found = []
    for row, estimate in zip(rows, report.estimates, strict=True):
        profile = traces.get(row)
        if isinstance(profile, ActivationProfile) and profile.step is not None:
            found.append((row, estimate, profile))
    modules: tuple[ModuleBreakdown, ...] = ()
    if options.by_module is not None:
        depth = options.by_module
        modules = tuple(module_breakdown(subject, options, row, est, p, depth) for row, est, p in found)
    steps = tuple(step_timeline(est, p, options) for _, est, p in found) if options.step_timeline else ()
    return dataclasses.replace(report, modules=modules, steps=steps)
