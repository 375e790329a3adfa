"""Time charts as text: braille line charts for the panes, block sparklines for small
terminals. Pure functions of the points and a size, so a pane redraws at any width at once
and the tests read the result without a terminal.

Axes are in plain units (blocks, requests, %, ms), never ``1.3e3``. Time runs on cells
aligned to the wall clock: a chart only shifts when a new column starts, so an idle screen
sends almost nothing over ssh.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvtop.view import format as fmt

Point = tuple[float, "float | None"]  # (unix seconds, value); None: not known then
Piece = tuple[str, str]  # (text, role): the widget maps a role to a style
Row = list[Piece]

# Braille dots: bit of the dot at (column 0/1, row 0..3 from the top) of a cell.
_DOT = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
BRAILLE = 0x2800
BLOCKS = " ▁▂▃▄▅▆▇█"  # a cell filled 0/8 .. 8/8 from the bottom
AXIS, TICKS = "axis", "ticks"  # the roles of the frame
ZERO_LEVEL = 1  # eighths a sparkline draws for zero: a floor, unlike no number at all


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    role: str  # its colour: the widget's component class
    points: Sequence[Point]
    join_s: float = 0.0  # silences up to this long are joined too (beyond 2.5 intervals)


@dataclass(frozen=True, slots=True)
class Rule:
    """A horizontal reference line: the pool's size, the idle floor, a leak estimate."""

    label: str
    role: str
    value: float


@dataclass(frozen=True, slots=True)
class Chart:
    """What a pane draws: series on one axis from 0 to ``top`` over the last ``span_s``."""

    series: tuple[Series, ...]
    now: float
    span_s: float
    top: float | None = None  # None: a round number above the highest point
    rules: tuple[Rule, ...] = ()
    unit: Callable[[float], str] = fmt.count  # an axis label from a value

    def axis_top(self) -> float:
        if self.top is not None and self.top > 0:
            return self.top
        highest = max((v for s in self.series for _, v in s.points if v is not None),
                      default=0.0)
        highest = max([highest, *(r.value for r in self.rules)])
        return nice_ceiling(highest)


def nice_ceiling(value: float) -> float:
    """The round number (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k) at or above ``value``;
    1 for nothing."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    for step in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0):
        if value <= step * scale * (1 + 1e-9):
            return step * scale
    return 10 * scale  # value < 10 x scale: the next power of ten


def bins(points: Iterable[Point], now: float, span_s: float, count: int) -> list[float | None]:
    """The mean value in each of ``count`` columns over the last ``span_s``, oldest first.
    Columns align to the wall clock, so the line moves only when a new column starts."""
    if count <= 0 or span_s <= 0:
        return []
    step = span_s / count
    last = int(now // step)
    sums = [0.0] * count
    counts = [0] * count
    for t, value in points:
        index = count - 1 - (last - int(t // step))
        if 0 <= index < count and value is not None and math.isfinite(value):
            sums[index] += value
            counts[index] += 1
    return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


def spacing_s(points: Sequence[Point]) -> float:
    """The usual time between two points (the scrape interval), 0 for fewer than two."""
    times = sorted(t for t, v in points if v is not None)
    gaps = sorted(b - a for a, b in itertools.pairwise(times) if b > a)
    return gaps[len(gaps) // 2] if gaps else 0.0


def join_gaps(values: list[float | None], most: int) -> list[float | None]:
    """Columns between two known values at most ``most`` apart filled in on the straight
    line between them: scrapes further apart than a column are one line, while a longer
    silence (a server down) stays a gap."""
    out = list(values)
    last = None
    for index, value in enumerate(values):
        if value is None:
            continue
        if last is not None and 1 < index - last <= most:
            start = values[last]
            assert start is not None
            for step in range(1, index - last):
                out[last + step] = start + (value - start) * step / (index - last)
        last = index
    return out


def _dot_rows(values: list[float | None], top: float, dots: int) -> list[int | None]:
    """Each value as a dot row from the bottom (0) to the top (dots - 1)."""
    return [None if v is None else min(max(round(v / top * (dots - 1)), 0), dots - 1)
            for v in values]


class _Canvas:
    """Braille cells, each with the role of the last series that put a dot in it."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.bits = [[0] * width for _ in range(height)]
        self.roles = [[""] * width for _ in range(height)]

    def dot(self, x: int, y: int, role: str) -> None:
        """Dot column ``x`` (two per cell), dot row ``y`` counted from the bottom."""
        from_top = self.height * 4 - 1 - y
        row, col = from_top // 4, x // 2
        self.bits[row][col] |= _DOT[x % 2][from_top % 4]
        self.roles[row][col] = role

    def line(self, rows: list[int | None], role: str) -> None:
        previous = None
        for x, y in enumerate(rows):
            if y is None:
                previous = None
                continue
            low, high = (y, y) if previous is None else (min(y, previous), max(y, previous))
            for level in range(low, high + 1):  # joined to the last point: no gaps
                self.dot(x, level, role)
            previous = y

    def rule(self, y: int, role: str) -> None:
        """A dotted line where no series drew."""
        from_top = self.height * 4 - 1 - y
        row = from_top // 4
        for col in range(self.width):
            if not self.bits[row][col] or self.roles[row][col] == role:
                self.bits[row][col] |= _DOT[0][from_top % 4]
                self.roles[row][col] = role

    def rows(self) -> list[Row]:
        out = []
        for bits, roles in zip(self.bits, self.roles, strict=True):
            row: Row = []
            for b, role in zip(bits, roles, strict=True):
                char = chr(BRAILLE + b) if b else " "
                if row and row[-1][1] == role:
                    row[-1] = (row[-1][0] + char, role)
                else:
                    row.append((char, role))
            out.append(row)
        return out


def _axis_labels(chart: Chart, top: float, height: int) -> dict[int, str]:
    """Row (from the top) -> label: the top, the rules, and 0 at the bottom."""
    labels = {0: chart.unit(top), height - 1: chart.unit(0)}
    for rule in chart.rules:
        if 0 <= rule.value <= top:
            row = height - 1 - round(rule.value / top * (height * 4 - 1)) // 4
            labels.setdefault(row, chart.unit(rule.value))
    return labels


TICK_STEPS_S = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def _tick_age(seconds: float) -> str:
    whole = round(seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{unit}"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60}s"
    return f"{whole}s"


def time_ticks(span_s: float, width: int) -> str:
    """``-5m   -4m   -3m   -2m   -1m   now`` under a plot ``width`` cells wide: round
    steps that divide the span, as many as fit with room between them, so the oldest
    label is the span itself and panes of different widths agree on it."""
    line = [" "] * width
    most = max(1, min(6, width // 8))
    fitting = [s for s in TICK_STEPS_S if span_s / s <= most]
    step = next((s for s in fitting if span_s % s == 0), fitting[0] if fitting else span_s)
    ago = 0.0
    while ago <= span_s + 1e-9:
        label = "now" if ago == 0 else f"-{_tick_age(ago)}"
        end = round((1 - ago / span_s) * (width - 1)) + 1  # labels end at their column
        start = min(max(end - len(label), 0), width - len(label))
        if start >= 0 and all(c == " " for c in line[max(start - 1, 0):start + len(label) + 1]):
            line[start:start + len(label)] = label
        ago += step
    return "".join(line)


def joined_bins(points: Sequence[Point], now: float, span_s: float, count: int,
                join_s: float = 0.0) -> list[float | None]:
    """:func:`bins` with the columns between two scrapes joined (:func:`join_gaps`), so a
    slow interval is a line, not dots; a silence longer than 2.5 intervals (or ``join_s``)
    stays a gap."""
    values = bins(points, now, span_s, count)
    if count <= 0 or span_s <= 0:
        return values
    longest = max(2.5 * spacing_s(points), join_s)
    return join_gaps(values, math.ceil(longest / (span_s / count)))


def render(chart: Chart, width: int, height: int) -> list[Row]:
    """The chart in ``width`` x ``height`` cells: a y axis in plain units on the left, the
    plot, and the time under it when there is room."""
    if width < 8 or height < 2:
        return []
    top = chart.axis_top()
    with_ticks = height >= 5
    plot_h = height - 1 if with_ticks else height
    labels = _axis_labels(chart, top, plot_h)
    label_w = max(len(text) for text in labels.values())
    plot_w = width - label_w - 1
    if plot_w < 4:
        return []
    canvas = _Canvas(plot_w, plot_h)
    dots = plot_h * 4
    for rule in chart.rules:
        if 0 <= rule.value <= top:
            canvas.rule(round(rule.value / top * (dots - 1)), rule.role)
    columns = plot_w * 2
    for series in chart.series:
        values = joined_bins(series.points, chart.now, chart.span_s, columns, series.join_s)
        canvas.line(_dot_rows(values, top, dots), series.role)
    rows = []
    for y, plotted in enumerate(canvas.rows()):
        tick = "┤" if y in labels else "│"
        rows.append([(f"{labels.get(y, ''):>{label_w}}{tick}", AXIS), *plotted])
    if with_ticks:
        rows.append([(" " * label_w + "└", AXIS), (time_ticks(chart.span_s, plot_w), TICKS)])
    return rows


def spark_rows(values: Sequence[float | None], top: float, height: int) -> list[str]:
    """Block sparkline ``height`` cells tall with eighth-cell steps, top row first. Zero is
    the floor (an eighth), any use shows at least two eighths, so a quiet server never looks
    like one with no numbers: an unknown value is blank."""
    eighths = height * 8
    levels = []
    for v in values:
        if v is None:
            levels.append(0)
            continue
        level = round(min(max(v / top, 0.0), 1.0) * eighths) if top > 0 else 0
        levels.append(max(level, ZERO_LEVEL + 1) if v > 0 else ZERO_LEVEL)
    return ["".join(BLOCKS[min(max(level - r * 8, 0), 8)] for level in levels)
            for r in range(height - 1, -1, -1)]
