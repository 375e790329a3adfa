"""The detail view of one engine: history plots, KV capacity and config, raw state."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from kvtop.ui import format as fmt
from kvtop.ui.fleet import status_cell
from kvtop.ui.widgets.history_plot import HistoryPlot, Series

if TYPE_CHECKING:
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import EngineKey, TargetState

Getters = tuple[tuple[str, Callable[["EngineStats"], "float | None"]], ...]
# (plot id, title, ((series label, value getter), ...))
PLOTS: tuple[tuple[str, str, Getters], ...] = (
    ("plot-kv", "KV used blocks", (("used", lambda s: s.blocks_used),)),
    ("plot-queue", "running vs waiting", (("running", lambda s: s.running),
                                          ("waiting", lambda s: s.waiting))),
    ("plot-hit", "prefix hit %", (("hit", lambda s: _pct(s.hit_rate)),)),
    ("plot-tps", "throughput tok/s", (("prompt", lambda s: s.prompt_tps),
                                      ("generation", lambda s: s.generation_tps))),
    ("plot-lat", "latency s", (("TTFT p50", lambda s: s.ttft and s.ttft.p50),
                               ("TTFT p99", lambda s: s.ttft and s.ttft.p99),
                               ("ITL p50", lambda s: s.itl and s.itl.p50))),
)

# -> (state, history of the engine, the engine shown); called at each redraw
DetailSource = Callable[[], "tuple[TargetState, list[EngineStats], EngineKey | None]"]


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def series_for(
    history: Iterable[EngineStats],
    getters: Getters,
    now: float,
    span_s: float,
) -> list[Series]:
    """Points within the last ``span_s`` seconds, unknown values left out (no fake zeros)."""
    recent = [s for s in history if now - s.t <= span_s]
    result = []
    for label, get in getters:
        points = tuple((s.t - now, v) for s in recent if (v := get(s)) is not None)
        result.append(Series(label, points))
    return result


def describe(state: TargetState, stats: EngineStats | None, now: float) -> Text:
    """The text beside the plots: identity, status with age, KV capacity and config."""
    target = state.target
    status = status_cell(state, now)
    lines = [
        f"{target.label}  {target.url}",
        f"server  {state.kind or fmt.DASH} {state.version or ''}".rstrip(),
        f"status  {status.text}   last good {fmt.age(state.age_s(now))} ago",
    ]
    if state.error:
        lines.append(f"error   {state.error}")
    if state.restarted_at is not None:
        lines.append(f"restart {fmt.age(now - state.restarted_at)} ago")
    if stats is not None:
        prefix = "counted" if stats.prefix_queries_total is not None else fmt.DASH
        lines += [
            f"model   {stats.model or fmt.DASH}   engine {stats.engine or fmt.DASH}",
            f"KV      {fmt.kv_cell(stats.kv_usage, stats.blocks_used, stats.blocks_total)}"
            f"  ({fmt.percent(stats.kv_usage)})",
            f"config  num_gpu_blocks {fmt.count(stats.blocks_total)}"
            f"  block_size {fmt.count(stats.block_size)}"
            f"  tokens {fmt.count(stats.tokens_total)}  prefix cache {prefix}",
            f"now     run {fmt.count(stats.running)}  wait {fmt.count(stats.waiting)}"
            f"  preempt/s {fmt.rate(stats.preemptions_per_s)}"
            f"  hit {fmt.percent(stats.hit_rate)} ({stats.hit_rate_scope or fmt.DASH})",
            f"tok/s   prompt {fmt.rate(stats.prompt_tps)}"
            f"  gen {fmt.rate(stats.generation_tps)}   window {fmt.age(stats.window_s)}",
            f"TTFT    {_quantiles(stats.ttft)}   ITL {_quantiles(stats.itl)}"
            f"   E2E {_quantiles(stats.e2e)}",
        ]
    lines += [f"note    {note}" for note in state.notes]
    return Text("\n".join(lines), no_wrap=True, overflow="ellipsis")


def _quantiles(q: object) -> str:
    if q is None:
        return fmt.DASH
    return "/".join(fmt.seconds(getattr(q, p)) for p in ("p50", "p90", "p99"))


class DetailScreen(Screen[None]):
    """Redrawn by the app at most once per interval; never collects anything itself."""

    BINDINGS = [  # noqa: RUF012 - Textual's class-level binding list
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, source: DetailSource, *, span_s: float, charts: bool) -> None:
        super().__init__()
        self._source = source
        self._span_s = span_s
        self._charts = charts

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail-body"):
            yield Static(id="detail-info")
            if self._charts:
                with Grid(id="detail-plots"):
                    for plot_id, title, _ in PLOTS:
                        yield HistoryPlot(title, id=plot_id, classes="plot")
            else:
                yield Static("charts off (--low-bandwidth)", id="detail-nocharts")
        yield Footer()

    def show(self, now: float) -> None:
        state, history, engine = self._source()
        stats = next(
            (s for s in state.engines if (s.model, s.engine) == engine),
            history[-1] if history else None,
        )
        self.query_one("#detail-info", Static).update(describe(state, stats, now))
        if not self._charts:
            return
        for plot_id, _, getters in PLOTS:
            plot = self.query_one(f"#{plot_id}", HistoryPlot)
            plot.show_series(series_for(history, getters, now, self._span_s), self._span_s)
