"""Column widths that keep every cell of a rich table whole."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.table import Table


def fit_columns(table: Table, console: Console, options: ConsoleOptions) -> bool:
    """Give every column of ``table`` a width that keeps each cell whole (no column below its longest word, nor
    below its ``min_width``), taking the room from the widest columns first; False, leaving the table to rich,
    where the columns' minimums alone are wider than the line.

    Left to rich, the widest columns shrink first whatever their minimum, and the names' and the sparkline's
    ``min_width`` are put back after the line was laid out: the table came out wider than the console, which
    cropped it at the edge (scan-model's ``170 u`` for ``170 unf``, ``unf@a``, at 80 columns with three targets;
    half the sparkline at 100), or a cell was folded inside a word (``unf@ama`` / ``x``, info's ``(2.22e-1`` /
    ``6)``)."""
    unbounded = options.update_width(10_000)
    lowest, widest = [], []
    for column in table.columns:
        sizes = [Measurement.get(console, unbounded, cell) for cell in (column.header, *column.cells)]
        most = max(*(size.maximum for size in sizes), column.min_width or 0)  # a sparkline's trailing blanks
        if column.max_width is not None:
            most = min(most, column.max_width)
        shortest = most if column.no_wrap else max(*(size.minimum for size in sizes), column.min_width or 0)
        lowest.append(min(shortest, most))  # a column that does not wrap is cut, not folded, below its widest
        widest.append(max(lowest[-1], most))
    if _rich_keeps_cells_whole(table, console, options, lowest):
        return True
    padding = Measurement.get(console, unbounded, table).maximum - sum(widest)  # rich's padding and rules
    room = options.max_width - padding
    if sum(lowest) > room:
        return False
    widths = list(widest)
    while sum(widths) > room:
        shrinkable = [w for w, low in zip(widths, lowest, strict=True) if w > low]
        top = max(shrinkable)
        next_down = max([w for w in shrinkable if w < top] or [0])
        for i, (w, low) in enumerate(zip(widths, lowest, strict=True)):
            if w == top and w > low:
                widths[i] = max(low, next_down, w - (sum(widths) - room))
    for column, width in zip(table.columns, widths, strict=True):
        column.width = width
    return True


def _rich_keeps_cells_whole(table: Table, console: Console, options: ConsoleOptions, lowest: list[int]) -> bool:
    """Whether rich's own layout (kept where it is right, so that a table that fits looks as it always did) fits
    the line with no column below ``lowest``. Reads rich's layout through its private helpers; a rich without
    them gets our layout."""
    try:
        extra = table._extra_width
        widths = table._calculate_column_widths(console, options.update_width(options.max_width - extra))
        padding = [table._get_padding_width(index) for index in range(len(table.columns))]
    except AttributeError:
        return False
    fits = sum(widths) + extra <= options.max_width
    return fits and all(w - p >= low for w, p, low in zip(widths, padding, lowest, strict=True))
