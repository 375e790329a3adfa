"""The selected engine's panes as data: a few lines of verdicts (leak, stall, LoRA), the
charts over its history (KV blocks with the pool and the floor, running vs waiting, the
windowed hit rate, throughput, latency, blocks stored and removed from its KV events), the
cache pane's lines (view/cache.py), and the figures a small terminal has room for under its
sparklines (the cache pane in one line, the pool's config, latency, the server). Pure
functions, so the widgets only draw and the rules are tested without a terminal.

Every string from outside (model and engine names, LoRA adapter names, verdict reasons that
quote them) goes through :func:`display_text` here or already did in the row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
    LEAK_LABEL,
    LEAK_LEVEL,
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
    from kvtop.derive.stats import EngineStats, Quantiles
    from kvtop.derive.tracker import TargetState

Piece = tuple[str, str]  # (text, role)
Line = list[Piece]
Getter = Callable[["EngineStats"], "float | None"]
MAX_ADAPTERS = 4  # LoRA names listed before "+N"
MAX_REASONS = 2  # finish reasons named beside the finished rate
MIN_GROWTH_S = 60.0  # a leak's growth is told over at least this long
HIT_JOIN_S = 30.0  # windows without a lookup joined over in the hit-rate chart
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
    facts: list[Line] = field(default_factory=list)  # most telling first: shown as room allows
    empty: str = "no numbers from this server"  # what a chart without a pane says


def _points(history: Sequence[EngineStats], get: Getter) -> list[Point]:
    return [(s.t, get(s)) for s in history]


def _series(history: Sequence[EngineStats], *specs: tuple[str, str, Getter]) -> tuple[Series, ...]:
    return tuple(Series(label, role, _points(history, get)) for label, role, get in specs)


def _legend(title: str, series: Sequence[Series], rules: Sequence[Rule] = ()) -> Line:
    """The title, then each series' colour and name (a single series needs none: the
    title names it), then the rules'. Short, so a 30-cell pane shows it whole."""
    line: Line = [(title, "title")]
    for item in series if len(series) > 1 else ():
        line += [(" ━ ", item.role), (item.label, "")]
    return line + _rules_legend(rules)


def _rules_legend(rules: Sequence[Rule]) -> Line:
    """Each rule's colour and name; "" names none (a band's other edge, named with its
    first)."""
    return [piece for rule in rules if rule.label
            for piece in ((" ┄ ", rule.role), (rule.label, ""))]


def with_rules(pane: PaneView, rules: Sequence[Rule]) -> PaneView:
    """``pane`` with more reference levels on its chart, named in its legend."""
    if not rules or pane.chart is None:
        return pane
    chart = replace(pane.chart, rules=(*pane.chart.rules, *rules))
    legend = pane.legend + _rules_legend(rules)
    return replace(pane, chart=chart, legend=legend)


@dataclass(frozen=True, slots=True)
class Growth:
    """How the leak detector's estimate grew over the history shown."""

    first: float
    last: float
    seconds: float
    pool: int | None

    @property
    def per_hour(self) -> float:
        return (self.last - self.first) / self.seconds * 3600

    @property
    def hours_to_full(self) -> float | None:
        if self.pool is None or self.per_hour <= 0:
            return None
        return max(self.pool - self.last, 0.0) / self.per_hour


def leak_growth(history: Sequence[EngineStats]) -> Growth | None:
    """The leaked-block estimate's first and last figure in ``history`` while the detector
    said WATCH or LEAK; None unless it grew over at least a minute."""
    points = [(s.t, s.leak.leaked_blocks, s.blocks_total) for s in history
              if s.leak is not None and s.leak.state in ("watch", "leak")
              and s.leak.leaked_blocks is not None]
    if len(points) < 2:
        return None
    (t0, first, _), (t1, last, pool) = points[0], points[-1]
    if t1 - t0 < MIN_GROWTH_S or last <= first:
        return None
    return Growth(first, last, t1 - t0, pool)


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
    if band is None:
        return None
    level = band.blocks(band.kv_p50, pool)
    return None if level is None else Rule(f"base p50 ({band.name})", "base", level)


def kv_pane(stats: EngineStats, history: Sequence[EngineStats], now: float,
            span_s: float, band: Band | None = None) -> PaneView:
    """Blocks used on an axis from 0 to the pool's size (percent when blocks are unknown),
    with the idle floor and, against a baseline, the baseline's median."""
    pool = stats.blocks_total
    usage = stats.kv_usage
    latest: Line = [(fmt.kv_cell(usage, stats.blocks_used, pool, 10), "")]
    if stats.blocks_used is not None and pool:  # the cell shows blocks: add the percent
        shown = usage if usage is not None else stats.blocks_used / pool
        latest.append((f" {fmt.percent(shown)}", ""))
    if band is not None and band.kv_p50 is not None:
        latest.append((f"  base {fmt.percent(band.kv_p50)}", "base"))
    if pool:
        series = _series(history, ("used", "s1", lambda s: s.blocks_used))
        rules = tuple(r for r in (floor_rule(stats), baseline_rule(band, pool)) if r is not None)
        chart = Chart(series, now, span_s, top=float(pool), rules=rules)
        legend = _legend(f"KV blocks of {fmt.count(pool)}", series, rules)
    else:
        series = _series(history, ("used", "s1", lambda s: _pct(s.kv_usage)))
        chart = Chart(series, now, span_s, top=100.0, unit=_percent_axis)
        legend = _legend("KV use %", series)
    return PaneView("kv", legend, latest, chart if _has_data(series) else None)


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def queue_pane(stats: EngineStats, history: Sequence[EngineStats], now: float,
               span_s: float) -> PaneView:
    series = _series(history, ("run", "s1", lambda s: s.running),
                     ("wait", "s2", lambda s: s.waiting))
    running: Line = [(fmt.count(stats.running), "")]
    waiting: Line = [(fmt.count(stats.waiting), "warn" if stats.waiting else "")]
    latest: Line = [("run ", "key"), *running, ("  wait ", "key"), *waiting]
    return PaneView("queue", _legend("requests", series), latest,
                    Chart(series, now, span_s) if _has_data(series) else None,
                    by_series={"run": running, "wait": waiting})


def hit_pane(stats: EngineStats, history: Sequence[EngineStats], now: float,
             span_s: float) -> PaneView:
    """The hit rate of each scrape window (the one HIT); the lifetime rate only as text. A
    window without lookups has no rate: quiet spells under HIT_JOIN_S are joined, so a
    bursty server's rate is a line, not a scatter of dots."""
    series = tuple(replace(s, join_s=HIT_JOIN_S) for s in
                   _series(history, ("window", "s1", lambda s: _pct(window_hit(s)))))
    latest: Line = [(fmt.percent(window_hit(stats)), ""),
                    (f"  lifetime {fmt.percent(lifetime_hit(stats))}", "dim")]
    empty = "prefix caching off" if stats.prefix_caching is False else "no lookups yet"
    chart = Chart(series, now, span_s, top=100.0, unit=_percent_axis)
    return PaneView("hit", _legend("prefix hit % (window)", series), latest,
                    chart if _has_data(series) else None, empty)


def throughput_pane(stats: EngineStats, history: Sequence[EngineStats], now: float,
                    span_s: float) -> PaneView:
    series = _series(history, ("in", "s1", lambda s: s.prompt_tps),
                     ("out", "s2", lambda s: s.generation_tps))
    latest: Line = [(f"{fmt.rate(stats.prompt_tps)} in  {fmt.rate(stats.generation_tps)} out",
                     "")]
    out: Line = [(fmt.rate(stats.generation_tps), ""), (" out", "dim"),
                 (f"  {fmt.rate(stats.prompt_tps)} in", "dim")]
    return PaneView("tps", _legend("tok/s", series), latest,
                    Chart(series, now, span_s) if _has_data(series) else None,
                    by_series={"out": out})


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
                     ("ITL", "s3", _quantile("itl", "p50")))
    ttft, itl = window_quantiles(stats.ttft), window_quantiles(stats.itl)
    ttft_p50, ttft_p99 = (None, None) if ttft is None else (ttft.p50, ttft.p99)
    ttft_text = f"{fmt.seconds(ttft_p50)}/{fmt.seconds(ttft_p99)}"
    latest: Line = [("TTFT ", "key"), (ttft_text, ""), ("  ITL ", "key"),
                    (fmt.seconds(None if itl is None else itl.p50), ""), ("  est.", "dim")]
    chart = Chart(series, now, span_s, unit=fmt.seconds)
    return PaneView("lat", _legend("TTFT", series), latest,
                    chart if _has_data(series) else None, "no request finished yet",
                    by_series={"p99": [(ttft_text, ""), (" p50/p99 est.", "dim")]})


# The panes after KV's (which alone takes the baseline), in the order they are shown.
PANES_AFTER_KV = (queue_pane, hit_pane, throughput_pane, latency_pane)


def leak_line(stats: EngineStats) -> Line:
    verdict = stats.leak
    if verdict is None:
        return [("leak ", "key"), ("not judged for this server", "dim")]
    line: Line = [("leak ", "key"), (LEAK_LABEL[verdict.state], LEAK_LEVEL[verdict.state]),
                  ("  ", "")]
    slope = verdict.slope_blocks_per_hour
    if verdict.state in ("watch", "leak") and slope:
        line.append((f"{fmt.slope(slope)}  ", LEAK_LEVEL[verdict.state]))
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


def no_match_view(search: str) -> EngineView:
    """A search that leaves no row: say so, and how to get the fleet back."""
    return EngineView("no row matches the search", [[
        ("no row matches ", "dim"), (repr(display_text(search, 60)), "warn"),
        (": the header still counts the whole fleet; escape clears the search", "dim")]],
        empty="")


NEVER_ANSWERED_HINTS: tuple[tuple[str, str], ...] = (  # (what, how), for a newcomer
    ("vLLM serves /metrics on its API port:", "vllm serve MODEL --port 8000"),
    ("SGLang with", "--enable-metrics"),
    ("llama.cpp with", "--metrics"),
    ("many servers, named and grouped, in", "~/.config/kvtop/config.toml"),
    ("a fleet Prometheus already scrapes:", "kvtop --prometheus http://prom:9090"),
    ("every key and column:", "F1"),
)


def _never_answered(state: TargetState, interval_s: float | None) -> list[Line]:
    """A server that never answered: where kvtop looks, what to try, then where servers
    serve their metrics (as many of these as the panel has rows for)."""
    every = f", trying every {fmt.age(interval_s)}" if interval_s else ""
    return [[("nothing answers at ", "dim"), (display_text(state.target.url, 120), ""),
             (every, "dim")],
            [("start the server, name others (", "dim"), ("kvtop HOST:PORT …", "key"),
             ("), or try ", "dim"), ("kvtop --demo", "key")],
            *([(f"{what} ", "dim"), (how, "key")] for what, how in NEVER_ANSWERED_HINTS)]


def engine_view(row: FleetRow | None, state: TargetState | None,
                history: Sequence[EngineStats], now: float, span_s: float, *,
                gpu: GpuOwned | None = None, with_gpu: bool = False,
                band: Band | None = None, interval_s: float | None = None) -> EngineView:
    """The panes for ``row``: a target without engines shows why there are no charts (one
    that never answered, what to try); a server that stopped answering keeps its history,
    with its status. ``with_gpu``: a line with what the server's GPUs use (``gpu``). A
    group's row is drawn by the app as its worst member's (:func:`group_view`). ``band``:
    the engine's baseline, drawn in the KV pane."""
    if row is None or state is None:
        return EngineView("no engine selected")
    title = f"{row.name} · {row.cells['model'].text}"
    stats = _shown_stats(row, history)
    status = status_line(row, state, now)
    view = EngineView(title, [status] if status is not None else [])
    if stats is None:
        why = row.cells["model"]
        if not state.error or display_text(state.error) != why.text:  # not said above
            view.lines.append([(why.text, why.level or "")])
        if state.last_good_t is None and state.status not in ("pending", "up"):
            view.lines += _never_answered(state, interval_s)
        return view
    stall = stall_line(stats)  # a stall is now: above the leak's trend
    for line in (stall, leak_line(stats), exact_evidence_line(stats),
                 lora_line(stats.lora), gpu_line(gpu) if with_gpu else None):
        if line is not None:
            view.lines.append(line)
    view.panes = [kv_pane(stats, history, now, span_s, band),
                  *(pane(stats, history, now, span_s) for pane in PANES_AFTER_KV)]
    view.facts = fact_lines(state, stats, now)
    _add_cache(view, stats, state, history, now, span_s)
    return view


def _add_cache(view: EngineView, stats: EngineStats, state: TargetState,
               history: Sequence[EngineStats], now: float, span_s: float) -> None:
    """The cache pane's lines, its blocks-a-second chart (a sparkline on a small terminal),
    and the pane in one line, the first of the facts a small terminal shows."""
    view.cache = cache_lines(stats, state.kv_channel)
    chart = cache_pane(history, now, span_s)
    if chart is not None:
        view.panes.append(PaneView("cache", _legend("blocks/s", chart.series),
                                   stored_tail(stats), chart))
    summary = cache_summary_line(stats, state.kv_channel)
    if summary is not None:
        view.facts.insert(0, summary)


def fact_lines(state: TargetState, stats: EngineStats, now: float) -> list[Line]:
    """What the sparklines' numbers leave out, most telling first: the pool's make-up,
    evictions and how requests end, latency in full, prefix lookups, the server, where it
    is read from."""
    caching = fmt.DASH if stats.prefix_caching is None else (
        "on" if stats.prefix_caching else "off")
    pool: Line = [("pool ", "key"), (f"{fmt.count(stats.blocks_total)} blocks", ""),
                  (f" × {fmt.count(stats.block_size)} tokens", ""),
                  ("  idle floor ", "key"), (fmt.count(stats.idle_floor_blocks), ""),
                  ("  prefix caching ", "key"), (caching, "")]
    ttft, itl, e2e = (window_quantiles(q) for q in (stats.ttft, stats.itl, stats.e2e))
    latency: Line = [("TTFT ", "key"), (_p50_p99(ttft), ""), ("  ITL ", "key"),
                     (_p50_p99(itl), ""), ("  E2E ", "key"), (_p50_p99(e2e), ""),
                     ("  p50/p99 est.", "dim")]
    age = state.age_s(now)
    server: Line = [("server ", "key"),
                    (display_text(f"{state.kind or fmt.DASH} {state.version or ''}", 40)
                     .rstrip(), ""),
                    ("  scraped ", "key"), ("never" if age is None else f"{fmt.age(age)} ago", ""),
                    ("  rates over ", "key"), (fmt.age(stats.window_s), "")]
    if state.restarted_at is not None:
        server += [("  restarted ", "key"), (f"{fmt.age(now - state.restarted_at)} ago", "")]
    lookups: Line = [("prefix lookups ", "key"), (_per_s(stats.prefix_queries_per_s), ""),
                     ("  lifetime hit ", "key"), (fmt.percent(lifetime_hit(stats)), ""),
                     (f" of {fmt.count(stats.prefix_queries_total)} {stats.prefix_unit or ''}"
                      .rstrip(), "dim")]
    where: Line = [("read from ", "key"), (display_text(state.target.url, 200), "")]
    return [pool, _queue_line(stats), latency, lookups, server, where]


def _queue_line(stats: EngineStats) -> Line:
    """Evictions and how requests end (finished a second, by reason)."""
    line: Line = [("preempt ", "key"), (_per_s(stats.preemptions_per_s), ""),
                  ("  swapped ", "key"), (fmt.count(stats.swapped), "")]
    finished = {reason: rate for reason, rate in stats.finished_per_s.items() if rate}
    if stats.finished_per_s:
        line += [("  finished ", "key"), (_per_s(sum(finished.values())), "")]
    if finished:  # the commonest ways requests end now
        most = sorted(finished.items(), key=lambda item: -item[1])[:MAX_REASONS]
        reasons = ", ".join(f"{display_text(reason, 20)} {fmt.rate(rate)}" for reason, rate in most)
        line.append((f" ({reasons})", "dim"))
    return line


def _per_s(value: float | None) -> str:
    return fmt.DASH if value is None else f"{fmt.rate(value)}/s"


def _p50_p99(q: Quantiles | None) -> str:
    return fmt.DASH if q is None else f"{fmt.seconds(q.p50)}/{fmt.seconds(q.p99)}"


def group_view(group: FleetRow, member: EngineView) -> EngineView:
    """A group's panes: those of its worst member (what needs a look), said so."""
    line: Line = [("group ", "key"), (group.cells["status"].text, ""),
                  ("  showing its worst: ", "dim"), (member.title, ""),
                  ("  (enter folds, ← →)", "dim")]
    return EngineView(group.name, [line, *member.lines], member.panes, member.cache,
                      member.facts, member.empty)


def _shown_stats(row: FleetRow, history: Sequence[EngineStats]) -> EngineStats | None:
    """The row's engine, else (a row for a target without engines now: it stopped
    answering) its last good numbers."""
    if row.stats is not None:
        return row.stats
    return history[-1] if history else None
