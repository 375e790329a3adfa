"""The selected engine's panes as data: a few lines of verdicts (leak, stall, LoRA) and the
charts over its history (KV blocks with the pool and the floor, running vs waiting, the
windowed hit rate, throughput, latency). Pure functions, so the widgets only draw and the
rules are tested without a terminal.

Every string from outside (model and engine names, LoRA adapter names, verdict reasons that
quote them) goes through :func:`display_text` here or already did in the row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvtop.safe_text import display_text
from kvtop.view import format as fmt
from kvtop.view.cache import (
    cache_lines,
    cache_pane,
    cache_summary_line,
    exact_evidence_line,
    stored_tail,
)
from kvtop.view.cells import (
    LEAK_LEVEL,
    Cell,
    leak_cell,
    lifetime_hit,
    window_hit,
    window_quantiles,
)
from kvtop.view.chart import Chart, Point, Rule, Series
from kvtop.view.fleet import FleetRow
from kvtop.view.gpus import memory_tail

if TYPE_CHECKING:
    from kvtop.baseline.overlay import Band
    from kvtop.collect.reading import LoraInfo
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import TargetState

Piece = tuple[str, str]  # (text, role)
Line = list[Piece]
Getter = Callable[["EngineStats"], "float | None"]
MAX_ADAPTERS = 4  # LoRA names listed before "+N"
STALL_ROLE = {"stalled": "alarm", "saturated": "warn"}


@dataclass(frozen=True, slots=True)
class PaneView:
    """One chart pane: its legend, its latest values, and the chart (None: nothing yet)."""

    key: str
    legend: Line
    latest: Line
    chart: Chart | None
    empty: str = "no data yet"
    by_series: dict[str, Line] = field(default_factory=dict)  # a series' own latest value


@dataclass(slots=True)
class EngineView:
    title: str
    lines: list[Line] = field(default_factory=list)
    panes: list[PaneView] = field(default_factory=list)
    cache: list[Line] = field(default_factory=list)  # the cache pane (view/cache.py)
    compact: list[Line] = field(default_factory=list)  # more lines a small terminal shows


def _points(history: Sequence[EngineStats], get: Getter) -> list[Point]:
    return [(s.t, get(s)) for s in history]


def _series(history: Sequence[EngineStats], *specs: tuple[str, str, Getter]) -> tuple[Series, ...]:
    return tuple(Series(label, role, _points(history, get)) for label, role, get in specs)


def _legend(title: str, series: Sequence[Series], rules: Sequence[Rule] = ()) -> Line:
    line: Line = [(title, "title")]
    for item in series:
        line += [("  ━ ", item.role), (item.label, "")]
    for rule in rules:
        line += [("  ┄ ", rule.role), (rule.label, "")]
    return line


def _has_data(series: Sequence[Series]) -> bool:
    return any(v is not None for s in series for _, v in s.points)


def _percent_axis(value: float) -> str:
    return f"{value:.0f}%"


def floor_rule(stats: EngineStats) -> Rule | None:
    """The level used blocks can't go under: the idle floor plus what the leak detector
    says leaked (a figure it gives only once it suspects a leak)."""
    verdict = stats.leak
    leaked = verdict.leaked_blocks if verdict is not None and verdict.state != "ok" else None
    floor = stats.idle_floor_blocks + (leaked or 0.0)
    if floor <= 0:
        return None
    if not leaked:
        role = "floor"
    else:
        role = "bad" if verdict is not None and verdict.state == "leak" else "warn"
    label = f"floor +{fmt.count(leaked)} leaked" if leaked else "idle floor"
    return Rule(label, role, floor)


def baseline_rule(band: Band | None, pool: int | None) -> Rule | None:
    """The baseline's median KV use (--baseline), as blocks of the pool now."""
    level = band.blocks(band.kv_p50, pool) if band is not None else None
    return None if level is None else Rule(f"base p50 ({band.name})", "base", level)


def kv_pane(stats: EngineStats, history: Sequence[EngineStats], now: float,
            span_s: float, band: Band | None = None) -> PaneView:
    """Blocks used on an axis from 0 to the pool's size (percent when blocks are unknown),
    with the idle floor and, against a baseline, the baseline's median."""
    pool = stats.blocks_total
    usage = stats.kv_usage
    latest: Line = [(fmt.kv_cell(usage, stats.blocks_used, pool, 10), ""),
                    (f" {fmt.percent(usage)}", "")]
    if band is not None and band.kv_p50 is not None:
        latest.append((f"  base {fmt.percent(band.kv_p50)}", "base"))
    if pool:
        series = _series(history, ("used", "s1", lambda s: s.blocks_used))
        rules = tuple(r for r in (floor_rule(stats), baseline_rule(band, pool)) if r is not None)
        chart = Chart(series, now, span_s, top=float(pool), rules=rules)
        legend = _legend(f"KV blocks · pool {fmt.count(pool)}", series, rules)
    else:
        series = _series(history, ("used", "s1", lambda s: _pct(s.kv_usage)))
        chart = Chart(series, now, span_s, top=100.0, unit=_percent_axis)
        legend = _legend("KV use %", series)
    return PaneView("kv", legend, latest, chart if _has_data(series) else None)


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def queue_pane(stats: EngineStats, history: Sequence[EngineStats], now: float,
               span_s: float) -> PaneView:
    series = _series(history, ("running", "s1", lambda s: s.running),
                     ("waiting", "s2", lambda s: s.waiting))
    running: Line = [(fmt.count(stats.running), "")]
    waiting: Line = [(fmt.count(stats.waiting), "warn" if stats.waiting else "")]
    latest: Line = [("run ", "key"), *running, ("  wait ", "key"), *waiting]
    return PaneView("queue", _legend("requests", series), latest,
                    Chart(series, now, span_s) if _has_data(series) else None,
                    by_series={"running": running, "waiting": waiting})


def hit_pane(stats: EngineStats, history: Sequence[EngineStats], now: float,
             span_s: float) -> PaneView:
    """The hit rate of each scrape window (the one HIT); the lifetime rate only as text."""
    series = _series(history, ("window", "s1", lambda s: _pct(window_hit(s))))
    latest: Line = [(fmt.percent(window_hit(stats)), ""),
                    (f"  lifetime {fmt.percent(lifetime_hit(stats))}", "dim")]
    empty = "prefix caching off" if stats.prefix_caching is False else "no lookups yet"
    chart = Chart(series, now, span_s, top=100.0, unit=_percent_axis)
    return PaneView("hit", _legend("prefix hit %", series), latest,
                    chart if _has_data(series) else None, empty)


def throughput_pane(stats: EngineStats, history: Sequence[EngineStats], now: float,
                    span_s: float) -> PaneView:
    series = _series(history, ("prompt", "s1", lambda s: s.prompt_tps),
                     ("generated", "s2", lambda s: s.generation_tps))
    latest: Line = [(f"{fmt.rate(stats.prompt_tps)} in  {fmt.rate(stats.generation_tps)} out",
                     "")]
    return PaneView("tps", _legend("tokens/s", series), latest,
                    Chart(series, now, span_s) if _has_data(series) else None)


def _quantile(name: str, part: str) -> Getter:
    def get(stats: EngineStats) -> float | None:
        q = window_quantiles(getattr(stats, name))
        return None if q is None else getattr(q, part)
    return get


def latency_pane(stats: EngineStats, history: Sequence[EngineStats], now: float,
                 span_s: float) -> PaneView:
    """TTFT and ITL percentiles, estimated from each window's histogram buckets."""
    series = _series(history, ("p50", "s1", _quantile("ttft", "p50")),
                     ("p99", "s2", _quantile("ttft", "p99")),
                     ("ITL p50", "s3", _quantile("itl", "p50")))
    ttft, itl = window_quantiles(stats.ttft), window_quantiles(stats.itl)
    ttft_text = f"{fmt.seconds(ttft and ttft.p50)}/{fmt.seconds(ttft and ttft.p99)}"
    latest: Line = [("TTFT ", "key"), (ttft_text, ""), ("  ITL ", "key"),
                    (fmt.seconds(itl and itl.p50), ""), ("  est.", "dim")]
    chart = Chart(series, now, span_s, unit=fmt.seconds)
    return PaneView("lat", _legend("TTFT", series), latest,
                    chart if _has_data(series) else None, "no request finished yet",
                    by_series={"p99": [(ttft_text, ""), (" p50/p99 est.", "dim")]})


# The panes after KV's (which alone takes the baseline), in the order they are shown.
PANES_AFTER_KV = (queue_pane, hit_pane, throughput_pane, latency_pane)


def leak_line(row: FleetRow, stats: EngineStats) -> Line:
    verdict = stats.leak
    if verdict is None:
        return [("leak ", "key"), ("not judged for this server", "dim")]
    label = leak_cell(verdict).text if verdict.state != "warmup" else "warming up"
    line: Line = [("leak ", "key"), (label, LEAK_LEVEL[verdict.state]), ("  ", "")]
    if verdict.hours_to_full is not None and verdict.state != "ok":
        line.append((f"full in {fmt.hours(verdict.hours_to_full)}  ", "bad"))
    leaked = fmt.count(verdict.leaked_blocks)
    if verdict.leaked_blocks and leaked not in verdict.reason:  # say each number once
        line.append((f"~{leaked} blocks leaked  ", ""))
    line.append((display_text(verdict.reason), ""))
    return line


def stall_line(stats: EngineStats) -> Line | None:
    """The stall verdict (kvtop/derive/stall.py) when it says something: STALLED loud (its
    reason says for how long nothing came out), SATURATED a warning. OK takes no row from
    the charts."""
    verdict = stats.stall
    if verdict is None or verdict.state not in ("stalled", "saturated"):
        return None
    return [("stall ", "key"), (verdict.state.upper(), STALL_ROLE[verdict.state]), ("  ", ""),
            (display_text(verdict.reason), "")]


def _names(names: tuple[str, ...]) -> str:
    shown = ", ".join(display_text(n, 40) for n in names[:MAX_ADAPTERS])
    more = len(names) - MAX_ADAPTERS
    return shown + (f" +{more}" if more > 0 else "")


def lora_line(lora: LoraInfo | None) -> Line | None:
    if lora is None:
        return None
    line: Line = [("LoRA ", "key"), (f"{len(lora.running)} running", "")]
    if lora.running:
        line.append((f" ({_names(lora.running)})", ""))
    line.append((f"  {len(lora.waiting)} waiting", "warn" if lora.waiting else ""))
    if lora.waiting:
        line.append((f" ({_names(lora.waiting)})", ""))
    if lora.max_lora is not None:
        line.append((f"  max {lora.max_lora} at once", "dim"))
    return line


def status_line(row: FleetRow, state: TargetState, now: float) -> Line | None:
    """Whether these numbers are live: a failed scrape says so with the last good age
    (nothing to say while the server answers)."""
    status = row.cells["status"]
    if state.status == "up" and status.level == "ok":
        return None
    line: Line = [("status ", "key"), (status.text, status.level or "")]
    if state.status != "up":
        age = state.age_s(now)
        when = "never" if age is None else f"{fmt.age(age)} ago"
        line += [("  last good ", "key"), (when, "")]
        if state.error:
            line += [("  ", ""), (display_text(state.error, 200), "dim")]
    return line


GpuOwned = tuple["int | None", "int | None"]  # bytes used, total on a server's GPUs


def gpu_line(owned: GpuOwned | None) -> Line:
    """What the server's GPUs use, as nvidia-smi shows it (the KV pool is inside it)."""
    return [("GPU ", "key"), (memory_tail(owned).strip(), "" if owned else "dim")]


def engine_view(row: FleetRow | None, state: TargetState | None,
                history: Sequence[EngineStats], now: float, span_s: float, *,
                gpu: GpuOwned | None = None, with_gpu: bool = False,
                band: Band | None = None) -> EngineView:
    """The panes for ``row``: a target without engines shows why there are no charts; a
    server that stopped answering keeps its history, with its status. ``with_gpu``: a
    line with what the server's GPUs use (``gpu``). A group's row is drawn by the app as
    its worst member's (:func:`group_view`). ``band``: the engine's baseline, drawn in the
    KV pane."""
    if row is None or state is None:
        return EngineView("no engine selected")
    title = f"{row.name} · {row.cells['model'].text}"
    stats = _shown_stats(row, state, history)
    status = status_line(row, state, now)
    view = EngineView(title, [status] if status is not None else [])
    if stats is None:
        why = row.cells["model"]
        if not state.error or display_text(state.error) != why.text:  # not said above
            view.lines.append([(why.text, why.level or "")])
        return view
    stall = stall_line(stats)  # a stall is now: above the leak's trend
    for line in (stall, leak_line(row, stats), exact_evidence_line(stats),
                 lora_line(stats.lora), gpu_line(gpu) if with_gpu else None):
        if line is not None:
            view.lines.append(line)
    view.panes = [kv_pane(stats, history, now, span_s, band),
                  *(pane(stats, history, now, span_s) for pane in PANES_AFTER_KV)]
    _add_cache(view, stats, state, history, now, span_s)
    return view


def _add_cache(view: EngineView, stats: EngineStats, state: TargetState,
               history: Sequence[EngineStats], now: float, span_s: float) -> None:
    """The cache pane's lines, its blocks-a-second chart (a sparkline on a small terminal,
    where the pane folds into one line)."""
    view.cache = cache_lines(stats, state.kv_channel)
    chart = cache_pane(history, now, span_s)
    if chart is not None:
        view.panes.append(PaneView("cache", _legend("blocks/s", chart.series),
                                   stored_tail(stats), chart))
    summary = cache_summary_line(stats, state.kv_channel)
    if summary is not None:
        view.compact.append(summary)


def group_view(group: FleetRow, member: EngineView) -> EngineView:
    """A group's panes: those of its worst member (what needs a look), said so."""
    line: Line = [("group ", "key"), (group.cells["status"].text, ""),
                  ("  showing its worst: ", "dim"), (member.title, ""),
                  ("  (enter folds, ← →)", "dim")]
    return EngineView(group.name, [line, *member.lines], member.panes, member.cache,
                      member.compact)


def _shown_stats(row: FleetRow, state: TargetState,
                 history: Sequence[EngineStats]) -> EngineStats | None:
    """The row's engine now, else (the server is down) its last good numbers."""
    if row.stats is not None:
        return row.stats
    current = next((s for s in state.engines if (s.model, s.engine) == row.engine), None)
    return current or (history[-1] if history else None)


def cell_piece(cell: Cell) -> Piece:
    return cell.text, cell.level or ""
