"""Under the table: the selected engine's key numbers, its KV sparkline over the GPU memory
sparkline of its GPUs (one time axis: the pool filling while nvidia-smi stays flat), and its
leak verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from kvtop.ui import format as fmt
from kvtop.ui.fleet import LEAK_LEVEL, Cell, FleetRow
from kvtop.ui.gpus import memory_points, memory_tail, memory_top

if TYPE_CHECKING:
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import TargetState

GpuSeries = Sequence[tuple[float, "int | None", "int | None"]]  # (t, used, total) bytes


def kv_points(
    history: Sequence[EngineStats], now: float, span_s: float, cells: int
) -> list[float | None]:
    """Mean used blocks per cell over the last ``span_s``; cells align to the wall clock,
    so the line only shifts when a new cell starts (less redraw than a sliding window)."""
    if cells <= 0:
        return []
    step = span_s / cells
    last = int(now // step)
    sums = [0.0] * cells
    counts = [0] * cells
    for stats in history:
        index = cells - 1 - (last - int(stats.t // step))
        if 0 <= index < cells and stats.blocks_used is not None:
            sums[index] += stats.blocks_used
            counts[index] += 1
    return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


class EnginePanel(Static):
    """Draws the engine it is handed; the app picks the engine and its history."""

    COMPONENT_CLASSES = {  # noqa: RUF012
        "panel--key", "panel--spark", "panel--ok", "panel--warn", "panel--bad",
        "panel--alarm", "panel--dim",
    }
    _shown: Text | None = None

    def show(self, row: FleetRow | None, state: TargetState | None,
             history: Sequence[EngineStats], now: float, span_s: float, *,
             gpu_series: GpuSeries = (),
             gpu_owned: tuple[int | None, int | None] | None = None) -> None:
        if row is None or state is None:
            self.border_title = "no engine selected"
            self._set(Text())
            return
        # A Text, not a str: Textual would read a str title as markup ("[link=…]" in a name).
        self.border_title = Text(f"{row.name} · {row.cells['model'].text}")
        stats = next((s for s in state.engines if (s.model, s.engine) == row.engine), None)
        if stats is None:
            self._set(self._line(("status ", "key"), _cell(row.cells["status"]),
                                 ("  ", ""), _cell(row.cells["model"])))
            return
        self._set(Text("\n").join([
            *self._spark_lines(stats, history, now, span_s, gpu_series, gpu_owned),
            self._leak_line(row, stats),
            self._numbers_line(row, stats),
        ]))

    def _set(self, text: Text) -> None:
        """Repaint only when the text differs; the panel's height is fixed, so no layout."""
        if text != self._shown:
            self._shown = text
            self.update(text, layout=False)

    def _line(self, *pieces: tuple[str, str]) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        for piece, role in pieces:
            text.append(piece, self._style(role) if role else "")
        return text

    def _style(self, role: str) -> Style | str:
        # A row highlighted while the app tears down reaches a panel whose styles are gone.
        try:
            return self.get_component_rich_style(f"panel--{role}")
        except KeyError:
            return ""

    def _spark_lines(self, stats: EngineStats, history: Sequence[EngineStats], now: float,
                     span_s: float, gpu_series: GpuSeries,
                     gpu_owned: tuple[int | None, int | None] | None) -> list[Text]:
        """KV blocks used over GPU memory used, drawn on the same cells of the same span."""
        usage = fmt.kv_cell(stats.kv_usage, stats.blocks_used, stats.blocks_total)
        kv_tail = f" {usage} {fmt.percent(stats.kv_usage)}  last {fmt.age(span_s)}"
        gpu_tail = memory_tail(gpu_owned)
        cells = max(self.content_size.width - 4 - max(len(kv_tail), len(gpu_tail)), 0)
        points = kv_points(history, now, span_s, cells)
        top = float(stats.blocks_total or max((p for p in points if p), default=0.0))
        kv = self._line(("KV  ", "key"), (fmt.sparkline(points, top), "spark"), (kv_tail, ""))
        if gpu_owned is None:
            return [kv, self._line(("GPU ", "key"), (gpu_tail.lstrip(), "dim"))]
        gpu_points = memory_points(gpu_series, now, span_s, cells)
        spark = fmt.sparkline(gpu_points, memory_top(gpu_series, gpu_owned))
        return [kv, self._line(("GPU ", "key"), (spark, "spark"), (gpu_tail, ""))]

    def _leak_line(self, row: FleetRow, stats: EngineStats) -> Text:
        verdict = stats.leak
        if verdict is None:
            return self._line(("leak ", "key"), ("not judged for this server", "dim"))
        label = row.cells["leak"].text if verdict.state != "warmup" else "warming up"
        pieces = [("leak ", "key"), (label, LEAK_LEVEL[verdict.state]), ("  ", "")]
        if verdict.hours_to_full is not None and verdict.state != "ok":
            pieces.append((f"full in {fmt.hours(verdict.hours_to_full)}  ", "bad"))
        leaked = fmt.count(verdict.leaked_blocks)
        if verdict.leaked_blocks and leaked not in verdict.reason:  # say each number once
            pieces.append((f"~{leaked} blocks leaked  ", ""))
        pieces.append((verdict.reason, ""))
        return self._line(*pieces)

    def _numbers_line(self, row: FleetRow, stats: EngineStats) -> Text:
        ttft = stats.ttft
        return self._line(
            ("run ", "key"), (fmt.count(stats.running), ""),
            ("  wait ", "key"), _cell(row.cells["waiting"]),
            ("  preempt/s ", "key"), _cell(row.cells["preempt"]),
            ("  hit ", "key"), (fmt.percent(stats.hit_rate), ""),
            ("  tok/s ", "key"), (f"{fmt.rate(stats.prompt_tps)} in "
                                  f"{fmt.rate(stats.generation_tps)} out", ""),
            ("  TTFT ", "key"),
            (fmt.DASH if ttft is None else f"{fmt.seconds(ttft.p50)}/{fmt.seconds(ttft.p99)}",
             ""),
        )


def _cell(cell: Cell) -> tuple[str, str]:
    return cell.text, cell.level or ""
