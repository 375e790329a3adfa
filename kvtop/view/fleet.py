"""The fleet view's model: target states -> ordered, filtered table rows and a summary.

Pure functions of the states and a clock, so the table widget only draws and the rules
(labels, sort order, what "unknown" looks like) are tested without a terminal.

This is also where the app's text from outside (target labels, model names, engine labels,
error messages) crosses the display boundary: every such string in a row is made safe by
:func:`~kvtop.safe_text.display_text` here, once per scrape when the rows are built, and the
widgets draw the rows' text as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter
from typing import TYPE_CHECKING, Literal

from kvtop.collect.reading import GPU_EXPORTER_KINDS
from kvtop.derive.verdicts import LEAK_RANK, STALL_AS_LEAK
from kvtop.safe_text import display_text
from kvtop.view import format as fmt

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvtop.baseline.overlay import Delta
    from kvtop.collect.target import Target
    from kvtop.derive.stats import EngineStats, Quantiles
    from kvtop.derive.tracker import EngineKey, TargetState
    from kvtop.derive.verdicts import LeakVerdict, StallVerdict

Level = Literal["ok", "warn", "bad", "alarm", "dim"]
NOT_INFERENCE = "not an inference server?"
RESTART_BADGE_S = 300.0  # how long a restart stays flagged in the status column


@dataclass(frozen=True, slots=True)
class Cell:
    text: str
    level: Level | None = None  # mapped to a style by the table's .tcss component classes
    keep: int = 0  # last characters that survive when the cell is cut (a DP engine's " e1")


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int
    priority: int  # lower survives longer when the terminal is narrow


COLUMNS: tuple[Column, ...] = (
    Column("name", "NAME", 16, 0),
    Column("model", "MODEL", 24, 5),
    Column("status", "STATUS", 10, 0),
    Column("kv", "KV BLOCKS", 17, 0),
    Column("leak", "LEAK", 13, 0),  # the reason kvtop exists: never dropped
    Column("running", "RUN", 4, 1),
    Column("waiting", "WAIT", 4, 1),
    Column("preempt", "PRE/s", 5, 3),
    Column("hit", "HIT", 5, 2),
    Column("prompt", "PP t/s", 6, 4),
    Column("gen", "GEN t/s", 7, 2),
    Column("ttft", "TTFT 50/99", 11, 3),
)
CELL_PADDING = 2  # one space on each side of a cell
# GPU memory of the server's GPUs (what nvidia-smi sees), shown once some GPU has an owner
GPU_COLUMN = Column("gpu", "GPU MEM", 9, 2)
NO_GPU = Cell(fmt.DASH, "dim")
# KV p50 (points) and TTFT p99 (%) of the last minutes against the baseline (--baseline)
DELTA_COLUMN = Column("delta", "Δ KV/TTFT", 11, 2)
NO_DELTA = Cell(fmt.DASH, "dim")


def visible_columns(width: int, *, gpu: bool = False, delta: bool = False) -> list[Column]:
    """The columns that fit in ``width`` cells, dropping the least important first; with
    ``gpu``, the GPU memory column after the KV one; with ``delta``, the baseline column
    after the leak one."""
    shown = list(COLUMNS)
    if gpu:
        shown.insert(next(i for i, c in enumerate(shown) if c.key == "kv") + 1, GPU_COLUMN)
    if delta:
        shown.insert(next(i for i, c in enumerate(shown) if c.key == "leak") + 1, DELTA_COLUMN)
    by_priority = sorted(shown, key=lambda c: -c.priority)
    for column in by_priority:
        if sum(c.width + CELL_PADDING for c in shown) <= width or column.priority == 0:
            break
        shown.remove(column)
    return shown


# Sort keys: a column's key (its values from FleetRow.sort_value), or "worst".
TEXT_SORTS = frozenset({"name", "model"})  # alphabetical; every other key biggest first
SORT_LABELS: dict[str, str] = {
    "name": "name", "model": "model", "worst": "worst first", "kv": "KV use",
    "leak": "leak/stall", "running": "running", "waiting": "queue", "preempt": "preemptions",
    "hit": "hit rate", "prompt": "prompt tok/s", "gen": "generation", "ttft": "TTFT p99",
}
SORT_CYCLE = ("name", "kv", "waiting", "preempt", "gen", "leak", "worst")  # the `o` key
COLUMN_SORT = {"status": "worst"}  # a column sorted by another key than its own
LARGE_FLEET = 32  # rows; past this the default sort is worst first instead of by name
PROBLEM_STATUSES = frozenset({"down", "timeout", "auth", "bad_payload", "stale"})
INFERENCE_KINDS = frozenset({"vllm", "sglang", "llamacpp", "trtllm"})
FAILURE_LABEL: dict[str, str] = {"down": "down", "timeout": "timeout", "auth": "auth",
                                 "bad_payload": "bad data"}
NOT_FOUND = "HTTP 404"  # how the poller's message for a 404 starts

# The leak indicator's text and colour level per detector state, in one place.
LEAK_LABEL: dict[str, str] = {"warmup": "…", "ok": "OK", "watch": "WATCH", "leak": "LEAK"}
LEAK_LEVEL: dict[str, Level] = {"warmup": "dim", "ok": "ok", "watch": "warn", "leak": "alarm"}


@dataclass(slots=True, eq=False)
class FleetRow:
    key: str  # stable across refreshes: url plus engine
    url: str
    engine: EngineKey | None  # None for a row that stands for the whole target
    name: str
    state: TargetState = field(repr=False)
    stats: EngineStats | None = field(repr=False)  # None for a target without engines
    status: Cell
    sort_values: dict[str, float | None] = field(default_factory=dict)  # see sort_value()
    gpu: Cell = NO_GPU  # the GPU column: changes with GPU reads, not with the server's state
    delta: Cell = NO_DELTA  # the baseline column: changes with the window, set by the app
    name_keep: int = 0  # characters at the end of the name kept when it is cut (" e1")
    _cells: dict[str, Cell] | None = field(default=None, repr=False)
    _search: str | None = field(default=None, repr=False)

    @property
    def cells(self) -> dict[str, Cell]:
        """Column key -> cell; made on first use, so only rows drawn pay for formatting."""
        if self._cells is None:
            if self.stats is None:
                cells = _empty_cells(self.state)
            else:
                cells = engine_cells(self.stats, live=self.state.status == "up")
            self._cells = cells | {"name": Cell(self.name, keep=self.name_keep),
                                   "status": self.status, "gpu": self.gpu,
                                   "delta": self.delta}
        return self._cells

    @property
    def search(self) -> str:
        """Lower-case text the filter matches; made on first use, so only a filter pays."""
        if self._search is None:
            self._search = _search_text(self)
        return self._search

    def sort_value(self, key: str) -> float | None:
        """The row's number for sort ``key``, worked out the first time it is asked for: a
        frame of 500 rows ordered by one key computes that key alone."""
        if key not in self.sort_values:
            self.sort_values[key] = _sort_value(key, self.state, self.stats)
        return self.sort_values[key]

    @property
    def is_group(self) -> bool:
        return False

    def set_gpu(self, cell: Cell) -> None:
        """A new GPU cell; the cells become a new dict, so the table sees the row changed."""
        if cell != self.gpu:
            self.gpu = cell
            if self._cells is not None:
                self._cells = self._cells | {"gpu": cell}

    def set_delta(self, cell: Cell) -> None:
        """A new baseline cell (as :meth:`set_gpu`)."""
        if cell != self.delta:
            self.delta = cell
            if self._cells is not None:
                self._cells = self._cells | {"delta": cell}


def row_key(url: str, engine: EngineKey | None) -> str:
    if engine is None:
        return url
    return f"{url}|{engine[0] or ''}|{engine[1] or ''}"


def failure_label(state: TargetState) -> str:
    """How the last scrape failed, in a word or two: a 404 is "not found", not bad data."""
    if state.error and state.error.startswith(NOT_FOUND):
        return "not found"
    kind = state.failure or (state.status if state.status != "stale" else "down")
    return FAILURE_LABEL.get(kind, kind)


def status_cell(state: TargetState, now: float) -> Cell:
    """up / restarted / unknown, or how it failed and how long ago it last answered. A
    target that failed once already says so: its numbers are the last good ones, dimmed."""
    status = state.status
    if status == "pending":
        return Cell("…", "dim")
    if status == "up":
        if state.restarted_at is not None and now - state.restarted_at <= RESTART_BADGE_S:
            return Cell("restarted", "warn")
        if state.kind == "unknown":
            return Cell("unknown", "warn")
        return Cell("up", "ok")
    ago = state.age_s(now)
    label = failure_label(state)
    if ago is None:
        return Cell(label, "bad")
    return Cell(f"{label} {fmt.age(ago)}", "warn" if status == "stale" else "bad")


def _kv_level(usage: float | None) -> Level | None:
    if usage is None:
        return None
    if usage >= 0.95:
        return "bad"
    return "warn" if usage >= 0.8 else None


def _engine_suffix(stats: EngineStats, engines: list[EngineStats]) -> str:
    """What tells one server's engines apart: " e1" for data-parallel ranks of one model."""
    if len(engines) < 2:
        return ""
    if len({e.model for e in engines}) == 1:
        return f" e{display_text(stats.engine, 12)}" if stats.engine is not None else ""
    parts = [p for p in (stats.model, stats.engine) if p]
    return " " + display_text("/".join(parts))


def leak_cell(verdict: LeakVerdict | None, stall: StallVerdict | None = None) -> Cell:
    """``LEAK +420/h``: the state, and the floor's slope once a rising floor is measured;
    ``STALL`` when the engine makes no progress and no leak explains it (at once, whatever
    the leak detector's warm-up); ``SATURATED`` for a pool pinned full that still moves,
    unless a rising floor says more."""
    state = verdict.state if verdict is not None else None
    if stall is not None and stall.state == "stalled" and state != "leak":
        return Cell("STALL", "alarm")
    if stall is not None and stall.state == "saturated" and state not in ("leak", "watch"):
        return Cell("SATURATED", "warn")
    if verdict is None:
        return Cell(fmt.DASH, "dim")
    text = LEAK_LABEL[verdict.state]
    slope = verdict.slope_blocks_per_hour
    if verdict.state in ("watch", "leak") and slope is not None and slope > 0:
        text = f"{text} {fmt.slope(slope)}"
    return Cell(text, LEAK_LEVEL[verdict.state])


def _leak_rank(stats: EngineStats) -> float | None:
    """LEAK and STALLED first (either is an outage now or soon), then WATCH, SATURATED."""
    stall = STALL_AS_LEAK.get(stats.stall.state) if stats.stall is not None else None
    leak = LEAK_RANK[stats.leak.state] if stats.leak is not None else None
    if stall is None:
        return leak
    return max(leak or 0, LEAK_RANK[stall])


def _worst(state: TargetState, stats: EngineStats | None) -> float | None:
    """LEAK, then WATCH, then unreachable or stale; within each, the fullest KV first."""
    if state.status == "pending":
        return None
    leak = _leak_rank(stats) if stats is not None else None
    problem = 1 if state.status in PROBLEM_STATUSES else 0
    rank = 2 + leak if leak else problem
    usage = stats.usage if stats is not None else None
    return 2 * rank + min(usage or 0.0, 1.0)  # usage never crosses into the next rank


def window_hit(stats: EngineStats) -> float | None:
    """The prefix hit rate over the last scrape window: the one HIT kvtop shows as such."""
    return stats.hit_rate if stats.hit_rate_scope == "window" else None


def lifetime_hit(stats: EngineStats) -> float | None:
    """Hits over lookups since the server started (or the rate it reports itself)."""
    if stats.prefix_queries_total and stats.prefix_hits_total is not None:
        return stats.prefix_hits_total / stats.prefix_queries_total
    return stats.hit_rate if stats.hit_rate_scope in ("lifetime", "reported") else None


def hit_cell(stats: EngineStats) -> Cell:
    """``42%`` over the window; ``(38%)`` dimmed when the window saw no lookup and only the
    lifetime (or server-reported) rate is known."""
    window = window_hit(stats)
    if window is not None:
        return Cell(fmt.percent(window))
    if stats.hit_rate is not None:
        return Cell(f"({fmt.percent(stats.hit_rate)})", "dim")
    return Cell(fmt.DASH)


def window_quantiles(q: Quantiles | None) -> Quantiles | None:
    """Latency estimates of the last window only: a first scrape's lifetime figures would
    turn into "–" at the next one, so they are never shown as current."""
    return q if q is not None and q.scope == "window" else None


def latency_text(q: Quantiles | None) -> str:
    q = window_quantiles(q)
    return fmt.DASH if q is None else f"{fmt.seconds(q.p50)}/{fmt.seconds(q.p99)}"


def engine_cells(stats: EngineStats, *, live: bool = True) -> dict[str, Cell]:
    """An engine's cells; not ``live`` (the last scrape failed), its numbers are dimmed."""
    usage = stats.usage
    waiting = stats.waiting
    preempt = stats.preemptions_per_s
    cells = {
        "kv": Cell(fmt.kv_cell(usage, stats.blocks_used, stats.blocks_total), _kv_level(usage)),
        "running": Cell(fmt.count(stats.running)),
        "waiting": Cell(fmt.count(waiting), "warn" if waiting else None),
        "preempt": Cell(fmt.rate(preempt), "bad" if preempt else None),
        "hit": hit_cell(stats),
        "prompt": Cell(fmt.rate(stats.prompt_tps)),
        "gen": Cell(fmt.rate(stats.generation_tps)),
        "ttft": Cell(latency_text(stats.ttft)),
    }
    if not live:
        cells = {key: Cell(cell.text, "dim") for key, cell in cells.items()}
    cells["model"] = Cell(display_text(stats.model) if stats.model else fmt.DASH)
    cells["leak"] = leak_cell(stats.leak, stats.stall)
    return cells


def delta_cell(delta: Delta | None) -> Cell:
    """``+12pt +40%``: KV p50 in points and TTFT p99 in percent against the baseline; red
    when either moved the wrong way by more than ``kvtop compare``'s smallest change that
    matters, green when one moved the right way and none the wrong way."""
    if delta is None:
        return NO_DELTA
    kv = fmt.DASH if delta.kv_points is None else f"{delta.kv_points * 100:+.0f}pt"
    ttft = fmt.DASH if delta.ttft_change is None else f"{delta.ttft_change * 100:+.0f}%"
    if delta.kv_worse or delta.ttft_worse:
        level: Level | None = "bad"
    elif delta.kv_better or delta.ttft_better:
        level = "ok"
    else:
        level = None
    return Cell(f"{kv} {ttft}", level)


def _empty_cells(state: TargetState) -> dict[str, Cell]:
    """Cells for a target with no engine to show: say why instead of drawing zeros."""
    gpus = len(state.gpus) if state.kind in GPU_EXPORTER_KINDS else 0
    return _cells_without_engines(state.status, state.kind, state.error, gpus)


@lru_cache(maxsize=1024)
def _cells_without_engines(status: str, kind: str | None, error: str | None,
                           gpus: int) -> dict[str, Cell]:
    """Shared (treat as read-only): 10,000 targets down for one reason are one dict."""
    cells = {c.key: Cell(fmt.DASH, "dim") for c in (*COLUMNS, GPU_COLUMN, DELTA_COLUMN)}
    if kind in GPU_EXPORTER_KINDS and status in ("up", "stale"):
        cells["model"] = Cell(f"{kind}: {gpus} GPU{'' if gpus == 1 else 's'}")
    elif status == "up" and kind == "unknown":
        cells["model"] = Cell(NOT_INFERENCE, "warn")
        cells["kv"] = Cell("not LLM server?", "warn")
    elif status == "up":
        cells["model"] = Cell(f"{display_text(kind or 'server')}: no engine reported", "warn")
    elif error:
        cells["model"] = Cell(display_text(error), "dim")
    return cells


def build_rows(states: list[TargetState], now: float) -> list[FleetRow]:
    """One row per (target, engine); one row for a target without engines (down, unknown)."""
    return [row for state in states for row in target_rows(state, status_cell(state, now))]


@dataclass(slots=True)
class _Built:
    engines: list[EngineStats]  # the very list the rows were built from
    seen: tuple[object, ...]
    status: Cell
    rows: list[FleetRow]


class RowCache:
    """:func:`build_rows` that keeps a target's rows while its state and status cell stay
    the same: with 500 engines a frame then rebuilds only the targets scraped since the
    last one (and the few whose age is counting)."""

    def __init__(self) -> None:
        self._built: dict[str, _Built] = {}

    def rows(self, states: list[TargetState], now: float) -> list[FleetRow]:
        rows: list[FleetRow] = []
        for state in states:
            status = status_cell(state, now)
            seen = (state.target, state.last_good_t, state.status, state.kind, state.error)
            built = self._built.get(state.target.url)
            if (built is None or built.engines is not state.engines or built.seen != seen
                    or built.status != status):
                built = _Built(state.engines, seen, status, target_rows(state, status))
                self._built[state.target.url] = built
            rows += built.rows
        return rows


@lru_cache(maxsize=1 << 15)  # a fleet of 10,000 must not evict its own
def shown_label(target: Target) -> str:
    """The target's label, safe to draw (it parses the URL each time it is asked)."""
    return display_text(target.label)


def _ttft_p99(stats: EngineStats) -> float | None:
    ttft = window_quantiles(stats.ttft)
    return None if ttft is None else ttft.p99


# Sort key -> the engine's number for it ("worst" also needs the target's state).
_ENGINE_SORT_VALUES: dict[str, Callable[[EngineStats], float | None]] = {
    "kv": attrgetter("usage"),
    "running": attrgetter("running"),
    "waiting": attrgetter("waiting"),
    "preempt": attrgetter("preemptions_per_s"),
    "hit": window_hit,
    "prompt": attrgetter("prompt_tps"),
    "gen": attrgetter("generation_tps"),
    "ttft": _ttft_p99,
    "leak": _leak_rank,
}


def _sort_value(key: str, state: TargetState, stats: EngineStats | None) -> float | None:
    if key == "worst":
        return _worst(state, stats)
    value_of = _ENGINE_SORT_VALUES.get(key)
    return None if stats is None or value_of is None else value_of(stats)


def _search_text(row: FleetRow) -> str:
    """What a filter looks in: the name, URL, group, kind and status, and the model (or, for
    a row without engines, the reason it has none)."""
    target = row.state.target
    what = row.stats.model if row.stats is not None else row.cells["model"].text
    parts = (shown_label(target), target.url, target.group, row.state.kind, row.status.text,
             row.name, what)
    return " ".join(str(p) for p in parts if p).lower()


def target_rows(state: TargetState, status: Cell) -> list[FleetRow]:
    """A target's rows: one per engine, or one that says why there is none."""
    target = state.target
    label = shown_label(target)
    if not state.engines:
        return [FleetRow(key=row_key(target.url, None), url=target.url, engine=None, name=label,
                         state=state, stats=None, status=status)]
    rows = []
    for stats in state.engines:
        suffix = _engine_suffix(stats, state.engines)
        engine: EngineKey = (stats.model, stats.engine)
        rows.append(FleetRow(
            key=row_key(target.url, engine), url=target.url, engine=engine, name=label + suffix,
            state=state, stats=stats, status=status,
            name_keep=len(suffix) if len(suffix) <= 6 else 0,
        ))
    return rows


def _text_key(row: FleetRow, sort_key: str) -> str:
    if sort_key == "model":
        return row.cells["model"].text.lower()
    return row.name.lower()


def order_rows(rows: list[FleetRow], sort_key: str, reverse: bool = False) -> list[FleetRow]:
    """Names A-Z, or numbers biggest first (``reverse`` turns either round); unknown values
    stay last either way, and ties go by name."""
    if sort_key in TEXT_SORTS:
        return sorted(rows, key=lambda r: (_text_key(r, sort_key), r.name.lower()),
                      reverse=reverse)
    known = [r for r in rows if r.sort_value(sort_key) is not None]
    unknown = [r for r in rows if r.sort_value(sort_key) is None]
    sign = 1.0 if reverse else -1.0
    known.sort(key=lambda r: (sign * (r.sort_value(sort_key) or 0.0), r.name.lower()))
    unknown.sort(key=lambda r: r.name.lower())
    return known + unknown


def filter_rows(rows: list[FleetRow], text: str) -> list[FleetRow]:
    """Rows whose name, model, URL, group, kind or status contains every word of ``text``."""
    words = text.lower().split()
    return [r for r in rows if all(w in r.search for w in words)]


@dataclass(frozen=True, slots=True)
class FleetSummary:
    """The header's numbers, over the rows shown (a filter narrows them too)."""

    hosts_up: int  # inference servers answering now (not GPU exporters, not unknown ones)
    hosts_total: int  # targets that are not GPU exporters
    blocks_used: float | None  # summed over engines that report both used and total
    blocks_total: int | None
    running: float
    waiting: float
    leaks: int = 0  # engines whose indicator says LEAK
    watches: int = 0  # ... and WATCH
    judged: int = 0  # engines past the detector's warmup
    stalls: int = 0  # engines whose stall verdict says STALLED
    saturated: int = 0  # ... and SATURATED
    hit_rate: float | None = None  # window hits over window lookups, all engines together
    prompt_tps: float | None = None
    generation_tps: float | None = None

    @property
    def kv_usage(self) -> float | None:
        """Fleet KV use weighted by capacity: a big pool counts more than a small one."""
        if not self.blocks_total or self.blocks_used is None:
            return None
        return self.blocks_used / self.blocks_total


class _Totals:
    """Running sums for :func:`summarise`."""

    def __init__(self) -> None:
        self.used = self.running = self.waiting = 0.0
        self.total = 0
        self.lookups = self.hits = 0.0
        self.rates: dict[str, float] = {}
        self.leak_states: list[str] = []
        self.stalls = self.saturated = 0

    def add(self, stats: EngineStats) -> None:
        usage = stats.usage
        if stats.blocks_total and usage is not None:
            used = stats.blocks_used
            self.used += used if used is not None else usage * stats.blocks_total
            self.total += stats.blocks_total
        self.running += stats.running or 0.0
        self.waiting += stats.waiting or 0.0
        hit, lookups = window_hit(stats), stats.prefix_queries_per_s
        if hit is not None and lookups:
            self.hits += hit * lookups
            self.lookups += lookups
        for name in ("prompt_tps", "generation_tps"):
            value = getattr(stats, name)
            if value is not None:
                self.rates[name] = self.rates.get(name, 0.0) + value
        if stats.leak is not None:
            self.leak_states.append(stats.leak.state)
        if stats.stall is not None:
            self.stalls += stats.stall.state == "stalled"
            self.saturated += stats.stall.state == "saturated"


def summarise(rows: list[FleetRow] | list[TargetState]) -> FleetSummary:
    """The header's numbers over ``rows`` (or every engine of ``states``)."""
    states = {id(s): s for s in _states_of(rows)}.values()
    totals = _Totals()
    for stats in _engines_of(rows):
        totals.add(stats)
    hosts = [s for s in states if s.kind not in GPU_EXPORTER_KINDS]
    leaks = totals.leak_states
    return FleetSummary(
        hosts_up=sum(1 for s in hosts if s.status == "up" and s.kind in INFERENCE_KINDS),
        hosts_total=len(hosts),
        blocks_used=totals.used if totals.total else None,
        blocks_total=totals.total or None,
        running=totals.running,
        waiting=totals.waiting,
        leaks=leaks.count("leak"),
        watches=leaks.count("watch"),
        judged=len(leaks) - leaks.count("warmup"),
        stalls=totals.stalls,
        saturated=totals.saturated,
        hit_rate=totals.hits / totals.lookups if totals.lookups else None,
        prompt_tps=totals.rates.get("prompt_tps"),
        generation_tps=totals.rates.get("generation_tps"),
    )


def _states_of(rows: list[FleetRow] | list[TargetState]) -> list[TargetState]:
    return [r.state if isinstance(r, FleetRow) else r for r in rows]


def _engines_of(rows: list[FleetRow] | list[TargetState]) -> list[EngineStats]:
    """The engines whose numbers count: those of servers up or just missed (stale)."""
    engines: list[EngineStats] = []
    for row in rows:
        if isinstance(row, FleetRow):
            if row.stats is not None and row.state.status in ("up", "stale"):
                engines.append(row.stats)
        elif row.status in ("up", "stale"):
            engines += row.engines
    return engines


@dataclass(frozen=True, slots=True)
class LeakChange:
    """An engine whose indicator moved between OK, WATCH and LEAK: worth one notification."""

    key: str
    name: str
    verdict: LeakVerdict


@dataclass(frozen=True, slots=True)
class StallEntry:
    """An engine whose stall verdict has just turned STALLED: a bell and an alert."""

    key: str
    name: str
    state: TargetState
    stats: EngineStats


def stall_entries(
    states: list[TargetState], seen: dict[str, str]
) -> tuple[list[StallEntry], dict[str, str]]:
    """Engines that entered STALLED since ``seen`` (row key -> stall state) and the new
    ``seen``: a held STALLED is told once, again only after it made progress."""
    entries: list[StallEntry] = []
    now_seen = dict(seen)
    for state in states:
        for stats in state.engines:
            if stats.stall is None:
                continue
            key = row_key(state.target.url, (stats.model, stats.engine))
            now_seen[key] = stats.stall.state
            if stats.stall.state == "stalled" and seen.get(key) != "stalled":
                name = shown_label(state.target) + _engine_suffix(stats, state.engines)
                entries.append(StallEntry(key, name, state, stats))
    return entries, now_seen


def leak_changes(
    states: list[TargetState], seen: dict[str, str]
) -> tuple[list[LeakChange], dict[str, str]]:
    """Changes of indicator level since ``seen`` (row key -> state) and the new ``seen``.

    Only a change of level counts (warmup -> OK does not), so a held state is told once, not
    at every poll. An engine that is gone keeps its last state.
    """
    changes: list[LeakChange] = []
    now_seen = dict(seen)
    for state in states:
        for stats in state.engines:
            verdict = stats.leak
            if verdict is None:
                continue
            key = row_key(state.target.url, (stats.model, stats.engine))
            before = seen.get(key, "warmup")
            now_seen[key] = verdict.state
            if LEAK_RANK[verdict.state] != LEAK_RANK[before]:
                name = shown_label(state.target) + _engine_suffix(stats, state.engines)
                changes.append(LeakChange(key, name, verdict))
    return changes, now_seen
