"""The selected engine on a small terminal: its verdict lines, then each chart shrunk to a
one-row sparkline with its number and unit beside it (KV over the GPU memory of its GPUs on
one time axis, blocks stored a second from its KV events, requests, hit rate, tokens/s,
latency), then as many of the engine's other figures (the cache pane in one line, the pool's
make-up, evictions, latency in full, the server) as the rows left hold: at 80x24 every row
says something. With --low-bandwidth the numbers come without the sparklines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from kvtop.ui.widgets.panes import ROLES, Styled
from kvtop.view.chart import Point, joined_bins, spark_rows
from kvtop.view.engine import EngineView, Line, PaneView
from kvtop.view.gpus import memory_tail, memory_top

GpuSeries = Sequence[tuple[float, "int | None", "int | None"]]  # (t, used, total) bytes
LABEL_W = 6  # "KV    ", "tok/s "
# (pane, series label, sparkline label): in the order they are shown and kept
SPARKS = (("kv", "used", "KV"), ("gpu", "", "GPU"), ("cache", "stored", "blk"),
          ("queue", "run", "run"), ("queue", "wait", "wait"), ("hit", "window", "hit"),
          ("tps", "out", "tok/s"), ("lat", "p99", "TTFT"))


@dataclass(frozen=True, slots=True)
class Spark:
    label: str
    points: Sequence[Point]
    top: float
    tail: Line
    role: str = "s1"
    join_s: float = 0.0  # as its chart series


def sparks(view: EngineView, gpu_series: GpuSeries,
           gpu_owned: tuple[int | None, int | None] | None) -> list[Spark]:
    """The sparklines for ``view``'s charts, in the order of :data:`SPARKS`."""
    panes = {pane.key: pane for pane in view.panes}
    out: list[Spark] = []
    for pane_key, series_label, label in SPARKS:
        if pane_key == "gpu":
            if gpu_owned is not None:
                points = [(t, used) for t, used, _ in gpu_series]
                out.append(Spark(label, points, memory_top(gpu_series, gpu_owned),
                                 [(memory_tail(gpu_owned), "")]))
            continue
        pane = panes.get(pane_key)
        spark = _pane_spark(pane, series_label, label) if pane is not None else None
        if spark is not None:
            out.append(spark)
    return out


def _pane_spark(pane: PaneView, series_label: str, label: str) -> Spark | None:
    chart = pane.chart
    tail = _tail(pane, series_label)
    if chart is None:
        return Spark(label, (), 1.0, tail)
    series = next((s for s in chart.series if s.label == series_label), None)
    if series is None:
        return None
    return Spark(label, series.points, chart.axis_top(), tail, series.role, series.join_s)


def _tail(pane: PaneView, series_label: str) -> Line:
    """The latest value beside a sparkline: its series' own where the pane has one per
    series (run / wait), else the pane's."""
    own = pane.by_series.get(series_label)
    return own if own is not None else pane.latest


def panel_lines(view: EngineView, items: list[Spark], height: int) -> tuple[int, int]:
    """How many sparklines and figure lines go under ``view``'s verdict lines in
    ``height`` rows: the sparklines first, then the figures, each a row."""
    room = max(height - len(view.lines), 0)
    shown = min(len(items), room)
    return shown, min(len(view.facts), room - shown)


class EnginePanel(Styled, Static):
    """Draws the engine it is handed; the app picks the engine and its history."""

    COMPONENT_CLASSES = {f"pane--{role}" for role in ROLES}  # noqa: RUF012
    PREFIX = "pane"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._styles = {}
        self._shown: Text | None = None
        self._args: tuple[EngineView, GpuSeries, tuple[int | None, int | None] | None,
                          float, float, bool] | None = None

    def show(self, view: EngineView, *, now: float, span_s: float, gpu_series: GpuSeries = (),
             gpu_owned: tuple[int | None, int | None] | None = None,
             charts: bool = True) -> None:
        self.border_title = Text(view.title)  # a Text: a name is never read as markup
        self._args = (view, gpu_series, gpu_owned, now, span_s, charts)
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if self._args is None:
            return
        view, gpu_series, gpu_owned, now, span_s, charts = self._args
        width, height = self.content_size
        items = sparks(view, gpu_series, gpu_owned)
        spark_count, fact_count = panel_lines(view, items, height)
        lines = [self.line_text(line) for line in view.lines]
        lines += self._spark_lines(items[:spark_count], now, span_s, width, charts)
        lines += [self.line_text(line) for line in view.facts[:fact_count]]
        text = Text("\n").join(lines)
        if text != self._shown:  # the panel's height is fixed: repaint, no layout
            self._shown = text
            self.update(text, layout=False)

    def _spark_lines(self, items: list[Spark], now: float, span_s: float, width: int,
                     drawn: bool) -> list[Text]:
        """A row per sparkline: label, the line (``drawn``; else the number alone), its
        number and unit."""
        tail_w = max((sum(len(p) for p, _ in s.tail) for s in items), default=0) + 1
        cells = max(width - LABEL_W - tail_w, 0) if drawn else 0
        out: list[Text] = []
        for spark in items:
            values = joined_bins(spark.points, now, span_s, cells, spark.join_s)
            [block] = spark_rows(values, spark.top, 1)
            line: Line = [(spark.label.ljust(LABEL_W), "key"), (block, spark.role)]
            line += [(" " if drawn else "", ""), *spark.tail]
            out.append(self.line_text(line))
        return out

