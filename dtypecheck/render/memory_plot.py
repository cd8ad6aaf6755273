"""``estimate-memory --plot FILE.png|FILE.html``: memory over the estimated step, as PyTorch's memory snapshot
viewer draws a real run: allocations in op order, forward/backward/optimizer shaded, the peak marked, the device's
usable memory (``--fit``) as a line. The HTML page is self-contained (the figure inline as SVG, no scripts)."""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import TYPE_CHECKING

from dtypecheck.errors import InputError
from dtypecheck.render import write_atomically
from dtypecheck.render.cells import fmt_bytes
from dtypecheck.render.html.page import CSP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from dtypecheck.memory.report import MemoryReport, StepTimeline

GIB = 2**30
_UNITS = ((GIB, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def plotted(report: MemoryReport) -> StepTimeline:
    """The row drawn: the first training row (the peak users size a device for), else the first."""
    if not report.steps:
        raise InputError("--plot: no pass was traced (a checkpoint has no forward pass)")
    trained = [s for s in report.steps if s.mode == "training"]
    return (trained or list(report.steps))[0]


def step_figure(report: MemoryReport) -> Figure:
    from matplotlib.figure import Figure

    step = plotted(report)
    fits = [e.fit for e in report.estimates if e.fit is not None]
    top = max([step.total, *(f.usable_bytes for f in fits)])
    # The axis in the largest unit the figure reaches a whole one of (a small model's step in KiB, not 0.004 MiB).
    unit, unit_name = next(((u, n) for u, n in _UNITS if top >= u), _UNITS[-1])
    xs = [i for i, _, _ in step.moments]
    resident = [step.resident_bytes / unit] * len(xs)
    activations = [(step.resident_bytes + a) / unit for _, a, _ in step.moments]
    gradients = [(step.resident_bytes + a + g) / unit for _, a, g in step.moments]
    figure = Figure(figsize=(10, 4.8), dpi=110)
    axes = figure.add_subplot()
    axes.fill_between(
        xs, 0, resident, step="post", color="#4c72b0", alpha=0.85, label="weights, buffers, optimizer", zorder=2
    )
    axes.fill_between(
        xs, resident, activations, step="post", color="#55a868", alpha=0.85, label="activations", zorder=2
    )
    axes.fill_between(xs, activations, gradients, step="post", color="#c44e52", alpha=0.85, label="gradients", zorder=2)
    end = step.ops
    backward = step.backward_from if step.backward_from is not None else end
    axes.axvspan(0, backward, color="#dddddd", alpha=0.6, lw=0, zorder=0)
    axes.text(backward / 2, 0.98, "forward", transform=axes.get_xaxis_transform(), ha="center", va="top")
    if step.backward_from is not None:
        axes.axvspan(backward, end, color="#f2e0c9", alpha=0.6, lw=0, zorder=0)
        axes.text((backward + end) / 2, 0.98, "backward", transform=axes.get_xaxis_transform(), ha="center", va="top")
    if step.optimizer_step_bytes is not None:
        width = max(end // 20, 1)
        axes.bar(
            end + width / 2, step.optimizer_step_bytes / unit, width=width, color="#8172b2", label="optimizer step"
        )
        axes.axvspan(end, end + width, color="#e4def2", alpha=0.6, lw=0, zorder=0)
        axes.text(end + width / 2, 0.98, "optim", transform=axes.get_xaxis_transform(), ha="center", va="top")
    peak_y = step.total / unit
    at = step.peak_index if step.optimizer_step_bytes is None or step.total != step.optimizer_step_bytes else end
    axes.plot([at], [peak_y], marker="v", color="black", markersize=9, linestyle="none")
    # Near the right end the label goes to the marker's left, clear of the axes' edge and the "optim" label.
    right = at > 0.8 * end
    axes.annotate(
        f"peak {fmt_bytes(step.total)}",
        (at, peak_y),
        textcoords="offset points",
        xytext=(-8 if right else 6, 6),
        ha="right" if right else "left",
    )
    if fits:
        usable = fits[0].usable_bytes / unit
        axes.axhline(
            usable, color="#dd8452", linestyle="--", label=f"{fits[0].device} usable {fmt_bytes(fits[0].usable_bytes)}"
        )
    axes.set_xlim(0, end + (max(end // 20, 1) if step.optimizer_step_bytes is not None else 0))
    axes.set_ylim(0, max(peak_y, fits[0].usable_bytes / unit if fits else 0) * 1.12)
    axes.set_xlabel("op of the traced step")
    axes.set_ylabel(f"bytes alive ({unit_name})")
    axes.set_title(f"{report.model.source}: {step.dtype} {step.mode} ({step.precision}), estimated", fontsize=10)
    axes.legend(loc="lower left", fontsize=8, framealpha=0.9)
    figure.tight_layout()
    return figure


def write_step_plot(report: MemoryReport, path: Path) -> None:
    """Draw the step to ``path`` (``.png``, or ``.html`` with the figure inline), atomically."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    figure = step_figure(report)
    buffer = io.BytesIO()
    if path.suffix.lower() == ".png":
        figure.savefig(buffer, format="png")
        write_atomically(path, buffer.getvalue())
        return
    # Text as text, not as glyph outlines: the page's numbers (the peak, the device's usable memory) can be selected,
    # searched and read aloud, and the page is a quarter of the size.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})  # the same step draws the same page
    svg = buffer.getvalue().decode("utf-8")
    svg = svg[svg.index("<svg") :]  # the XML prolog and doctype do not belong inside HTML
    title = html.escape(f"dtypecheck estimate-memory: {report.model.source}")
    # The reports' policy (render/html/page.py): the page can load nothing, as --format html's pages cannot.
    policy = f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
    head = f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{policy}<title>{title}</title></head>\n'
    page = f"{head}<body>\n{svg}\n</body></html>\n"
    write_atomically(path, page)
