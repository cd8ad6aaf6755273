"""``scan-model --plot``: the checkpoint's log2-magnitude distribution against each target's representable range."""

from __future__ import annotations

import io
import math
from collections import Counter
from pathlib import Path

from dtypecheck.dtypes import lookup
from dtypecheck.errors import UsageError
from dtypecheck.output import write_atomically
from dtypecheck.scan.report import ScanReport


def require_matplotlib() -> None:
    """Fail before scanning, with the fix, when the optional extra is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed: pip install 'dtypecheck[plot]'") from None


def magnitude_distribution(report: ScanReport) -> Counter[int]:
    """Values per binade ``floor(log2|x|)`` over every float tensor of the checkpoint."""
    total: Counter[int] = Counter()
    for tensor in report.tensors:
        histogram = tensor.log2_histogram
        if histogram is not None:
            for offset, count in enumerate(histogram.counts):
                if count:
                    total[histogram.start + offset] += count * histogram.sampled_every
    return total


def write_plot(report: ScanReport, path: Path) -> None:
    """Draw the PNG atomically (temporary file + rename)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    distribution = magnitude_distribution(report)
    windows = [(name, lookup(name).fmt) for name in report.targets if lookup(name).kind == "float"]
    figure, axes = plt.subplots(figsize=(10, 2.8 + 0.35 * len(windows)))
    if distribution:
        exponents = sorted(distribution)
        axes.bar(exponents, [distribution[e] for e in exponents], width=1.0, align="edge", color="#4c72b0")
        axes.set_yscale("log")
    spans = [
        (math.log2(fmt.smallest_positive), math.log2(fmt.smallest_normal), math.log2(fmt.max)) for _, fmt in windows
    ]
    # Show the data and the narrow formats whole; a wide one (bfloat16: 2^-133..2^128) is cut at the edges.
    narrow = [(low, high) for low, _, high in spans if high - low < 80]
    lows = [min(distribution, default=0), *(low for low, _ in narrow)]
    highs = [max(distribution, default=0) + 1, *(high for _, high in narrow)]
    left, right = min(lows) - 4, max(highs) + 4
    axes.set_xlim(left, right)
    transform = axes.get_xaxis_transform()
    for row, ((name, _), (low, normal, high)) in enumerate(zip(windows, spans, strict=True)):
        y = 1.03 + 0.07 * row
        axes.hlines(
            y, max(low, left), min(normal, right), transform=transform, colors="#c4e6c3", linewidth=5, clip_on=False
        )
        axes.hlines(
            y, max(normal, left), min(high, right), transform=transform, colors="#55a868", linewidth=5, clip_on=False
        )
        label_at = min(high, right) + 0.3
        axes.text(label_at, y, name, transform=transform, va="center", fontsize=8, clip_on=False)
    axes.set_xlabel("log2 |x|  (bars: values per binade; lines: each target's subnormal (light) and normal range)")
    axes.set_ylabel("values")
    axes.set_title(f"{report.source}", loc="left", fontsize=9, pad=14 + 16 * len(windows))
    figure.tight_layout()
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(figure)
    write_atomically(path, buffer.getvalue())
