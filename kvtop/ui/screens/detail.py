"""The detail view of one engine: its identity, KV capacity and config, the leak detector's
evidence, and the main screen's charts at full size over the history's span."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from kvtop.safe_text import display_text as shown
from kvtop.ui.widgets.message_line import MessageLine
from kvtop.ui.widgets.panes import ChartPane
from kvtop.view import format as fmt
from kvtop.view.cache_detail import cache_detail_lines
from kvtop.view.cells import LEAK_LABEL, lifetime_hit, status_cell, window_hit
from kvtop.view.chart import Rule
from kvtop.view.engine import PANES_AFTER_KV, PaneView, kv_pane, leak_growth, with_rules
from kvtop.view.fleet import shown_label

if TYPE_CHECKING:
    from kvtop.baseline.overlay import Band
    from kvtop.derive.stats import EngineStats, Quantiles
    from kvtop.derive.tracker import EngineKey, TargetState
    from kvtop.derive.verdicts import LeakVerdict, StallVerdict

# The baseline's levels drawn in each pane: (legend label, value of the band given the
# pool's size now); "" is the other edge of a band already in the legend
REFERENCES: dict[str, tuple[tuple[str, Callable[[Band, int | None], float | None]], ...]] = {
    "kv": (("base p5-95", lambda b, pool: b.blocks(b.kv_p5, pool)),
           ("", lambda b, pool: b.blocks(b.kv_p95, pool))),
    "queue": (("base run", lambda b, _: b.running), ("base wait", lambda b, _: b.waiting)),
    "hit": (("base hit", lambda b, _: _pct(b.hit_rate)),),
    "tps": (("base in", lambda b, _: b.prompt_tps), ("base out", lambda b, _: b.generation_tps)),
    "lat": (("base p50", lambda b, _: b.ttft_p50), ("base p99", lambda b, _: b.ttft_p99),
            ("base ITL", lambda b, _: b.itl_p50)),
}

# -> (state, history of the engine, the engine shown); called at each redraw
PANE_KEYS = ("kv", "queue", "hit", "tps", "lat")
DetailSource = Callable[[], "tuple[TargetState, list[EngineStats], EngineKey | None]"]
# -> the engine's baseline (--baseline), or None
BandSource = Callable[[], "Band | None"]


def references(pane_key: str, band: Band | None, pool: int | None = None) -> tuple[Rule, ...]:
    """The baseline's levels for one pane beyond the KV pane's median (KV use as the same
    fullness of the pool now); those it does not know are left out."""
    if band is None:
        return ()
    return tuple(Rule(label, "base", value) for label, get in REFERENCES.get(pane_key, ())
                 if (value := get(band, pool)) is not None)


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def detail_panes(stats: EngineStats | None, history: list[EngineStats], now: float,
                 span_s: float, band: Band | None) -> list[PaneView]:
    """The main screen's panes over the detail's span, with every baseline level: the KV
    axis runs to the pool, axes in plain units, legends in the borders."""
    if stats is None:
        return []
    panes = [kv_pane(stats, history, now, span_s, band),
             *(pane(stats, history, now, span_s) for pane in PANES_AFTER_KV)]
    return [with_rules(pane, references(pane.key, band, stats.blocks_total)) for pane in panes]


def describe(state: TargetState, stats: EngineStats | None, now: float,
             band: Band | None = None, history: Sequence[EngineStats] = ()) -> Text:
    """The text beside the plots: identity, status with age, KV capacity and config.
    Every string from outside goes through ``shown`` (the display boundary), so a name with
    a newline can't add a line and the result is one plain Text, never markup."""
    target = state.target
    status = status_cell(state, now)
    lines = [
        f"{shown_label(target)}  {shown(target.url)}",
        f"server  {shown(state.kind or fmt.DASH)} {shown(state.version or '')}".rstrip(),
        f"status  {status.text}   last good {_ago(state.age_s(now))}",
    ]
    if state.error:
        lines.append(f"error   {shown(state.error)}")
    if state.restarted_at is not None:
        lines.append(f"restart {fmt.age(now - state.restarted_at)} ago")
    if stats is not None:
        lines += [
            f"model   {shown(stats.model or fmt.DASH)}   engine {shown(stats.engine or fmt.DASH)}",
            f"KV      {fmt.kv_cell(stats.kv_usage, stats.blocks_used, stats.blocks_total)}"
            f"  ({fmt.percent(stats.kv_usage)})",
            *config_lines(stats),
            *leak_lines(stats.leak, history),
            *stall_lines(stats.stall),
            *cache_detail_lines(stats, state.kv_channel),
            f"now     run {fmt.count(stats.running)}  wait {fmt.count(stats.waiting)}"
            f"  preempt/s {fmt.rate(stats.preemptions_per_s)}"
            f"  hit {fmt.percent(window_hit(stats))} (window)"
            f"  lifetime {fmt.percent(lifetime_hit(stats))}",
            f"tok/s   prompt {fmt.rate(stats.prompt_tps)}"
            f"  gen {fmt.rate(stats.generation_tps)}   window {fmt.age(stats.window_s)}",
            f"TTFT    {_quantiles(stats.ttft)}   ITL {_quantiles(stats.itl)}"
            f"   E2E {_quantiles(stats.e2e)}",
        ]
    if band is not None:
        lines.append(f"base    KV p50 {fmt.percent(band.kv_p50)} (p5-95 "
                     f"{fmt.percent(band.kv_p5)}-{fmt.percent(band.kv_p95)})"
                     f"  TTFT p99 {fmt.seconds(band.ttft_p99)}  baseline {shown(band.name)}")
    lines += [f"note    {shown(note)}" for note in state.notes]
    return Text("\n".join(lines), no_wrap=True, overflow="ellipsis")


CONFIG_KEYS = ("num_gpu_blocks", "block_size", "kv_cache_size_tokens", "enable_prefix_caching")


def config_lines(stats: EngineStats) -> list[str]:
    """The KV pool's configuration: vLLM's cache_config_info labels, else what was derived."""
    config = stats.cache_config
    caching = fmt.DASH if stats.prefix_caching is None else str(stats.prefix_caching)
    derived = {
        "num_gpu_blocks": fmt.count(stats.blocks_total),
        "block_size": fmt.count(stats.block_size),
        "kv_cache_size_tokens": fmt.count(stats.tokens_total),
        "enable_prefix_caching": caching,
    }
    main = "  ".join(f"{k} {shown(config.get(k, derived[k]))}" for k in CONFIG_KEYS)
    rest = "  ".join(f"{shown(k)} {shown(v)}" for k, v in sorted(config.items())
                     if k not in CONFIG_KEYS and k != "engine" and not k.startswith("_"))
    return [f"config  {main}"] + ([f"        {rest}"] if rest else [])


def leak_lines(verdict: LeakVerdict | None, history: Sequence[EngineStats] = ()) -> list[str]:
    """The leak verdict: state, reason, the estimate and the evidence behind it. Before the
    detector has a slope of its own (it wants 5 minutes of idle points), the growth of its
    estimate over the history shown says how fast, labelled as such."""
    if verdict is None:
        return ["leak    not judged for this server"]
    lines = [f"leak    {LEAK_LABEL[verdict.state]}  {shown(verdict.reason)}"]
    if verdict.state in ("watch", "leak"):
        figures = (f"        leaked {fmt.count(verdict.leaked_blocks)} blocks"
                   f"  slope {fmt.slope(verdict.slope_blocks_per_hour)}"
                   f"  full in {fmt.hours(verdict.hours_to_full)}")
        growth = leak_growth(history) if verdict.slope_blocks_per_hour is None else None
        if growth is not None:
            figures = (f"        leaked {fmt.count(growth.first)} → {fmt.count(growth.last)}"
                       f" blocks in {fmt.age(growth.seconds)}: {fmt.slope(growth.per_hour)}"
                       f" here, full in {fmt.hours(growth.hours_to_full)} at that pace")
        lines.append(figures)
    items = [f"{k}={_evidence_value(v)}" for k, v in verdict.evidence.items()]
    for start in range(0, len(items), EVIDENCE_PER_LINE):
        head = "evidence" if start == 0 else ""
        lines.append(f"{head:<8} {'  '.join(items[start:start + EVIDENCE_PER_LINE])}")
    return lines


def stall_lines(verdict: StallVerdict | None) -> list[str]:
    """The stall verdict: state, reason and the numbers it rests on."""
    if verdict is None:
        return []
    evidence = "  ".join(f"{k}={_evidence_value(v)}" for k, v in verdict.evidence.items())
    return [f"stall   {verdict.state.upper()}  {shown(verdict.reason)}"] + (
        [f"         {evidence}"] if evidence else [])


EVIDENCE_PER_LINE = 4


def _evidence_value(value: float | str) -> str:
    """A number in plain digits (never 1.5e+03), at most four decimals."""
    if not isinstance(value, float):
        return shown(value)
    if abs(value) >= 100:
        return f"{value:.0f}"
    # the digit before the point always stays: never an empty string
    return f"{value:.4f}".rstrip("0").rstrip(".")


def _ago(age: float | None) -> str:
    return "never" if age is None else f"{fmt.age(age)} ago"


def _quantiles(q: Quantiles | None) -> str:
    """p50/p90/p99, estimated from histogram buckets; labelled when over the lifetime."""
    if q is None:
        return fmt.DASH
    text = "/".join(fmt.seconds(getattr(q, p)) for p in ("p50", "p90", "p99"))
    return text if q.scope == "window" else f"{text} (lifetime)"


class DetailScreen(Screen[None]):
    """Redrawn by the app at most once per interval; never collects anything itself."""

    BINDINGS = [  # noqa: RUF012 - Textual's class-level binding list
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, source: DetailSource, *, clock: Callable[[], float], span_s: float,
                 charts: bool, band: BandSource | None = None) -> None:
        super().__init__()
        self._source = source
        self._clock = clock
        self._band = band
        self._span_s = span_s
        self._charts = charts

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail-body"):
            yield Static(id="detail-info")
            if self._charts:
                with Grid(id="detail-plots"):
                    for key in PANE_KEYS:
                        yield ChartPane(id=f"plot-{key}", classes="pane plot")
            else:
                yield Static("charts off (--low-bandwidth)", id="detail-nocharts")
        yield Footer()
        yield MessageLine()

    def on_mount(self) -> None:
        self._fill(self._clock())  # at once, not at the app's next draw

    def show(self, now: float) -> None:
        """The app's redraw. One that comes before the screen is mounted (a push is not
        synchronous) leaves the filling to on_mount."""
        if self.is_mounted:
            self._fill(now)

    def _fill(self, now: float) -> None:
        state, history, engine = self._source()
        stats = next(
            (s for s in state.engines if (s.model, s.engine) == engine),
            history[-1] if history else None,
        )
        band = self._band() if self._band is not None else None
        self.query_one("#detail-info", Static).update(describe(state, stats, now, band,
                                                               history))
        if not self._charts:
            return
        panes = {pane.key: pane for pane in detail_panes(stats, history, now, self._span_s,
                                                         band)}
        for key in PANE_KEYS:
            self.query_one(f"#plot-{key}", ChartPane).show(panes.get(key), "no numbers yet")
