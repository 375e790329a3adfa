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
from typing import TYPE_CHECKING, Literal

from kvtop.collect.reading import GPU_EXPORTER_KINDS
from kvtop.safe_text import display_text
from kvtop.ui import format as fmt

if TYPE_CHECKING:
    from kvtop.collect.target import Target
    from kvtop.derive.leak import LeakVerdict
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import EngineKey, TargetState

Level = Literal["ok", "warn", "bad", "alarm", "dim"]
NOT_INFERENCE = "not an inference server?"
RESTART_BADGE_S = 300.0  # how long a restart stays flagged in the status column


@dataclass(frozen=True, slots=True)
class Cell:
    text: str
    level: Level | None = None  # mapped to a style by the table's .tcss component classes


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
    Column("hit", "HIT", 4, 2),
    Column("prompt", "PP t/s", 6, 4),
    Column("gen", "GEN t/s", 7, 2),
    Column("ttft", "TTFT 50/99", 11, 3),
)
CELL_PADDING = 2  # one space on each side of a cell
# GPU memory of the server's GPUs (what nvidia-smi sees), shown once some GPU has an owner
GPU_COLUMN = Column("gpu", "GPU MEM", 9, 2)
NO_GPU = Cell(fmt.DASH, "dim")


def visible_columns(width: int, *, gpu: bool = False) -> list[Column]:
    """The columns that fit in ``width`` cells, dropping the least important first; with
    ``gpu``, the GPU memory column after the KV one."""
    shown = list(COLUMNS)
    if gpu:
        shown.insert(next(i for i, c in enumerate(shown) if c.key == "kv") + 1, GPU_COLUMN)
    by_priority = sorted(shown, key=lambda c: -c.priority)
    for column in by_priority:
        if sum(c.width + CELL_PADDING for c in shown) <= width or column.priority == 0:
            break
        shown.remove(column)
    return shown


SORT_KEYS: tuple[tuple[str, str], ...] = (
    ("name", "name"),
    ("kv", "KV use"),
    ("waiting", "queue"),
    ("preempt", "preemptions"),
    ("gen", "generation"),
    ("leak", "leak"),
    ("worst", "worst first"),  # a big fleet's default: what needs a look on the first screen
)
WORST_FIRST = len(SORT_KEYS) - 1
LARGE_FLEET = 32  # rows; past this the default sort is worst first instead of by name
PROBLEM_STATUSES = frozenset({"down", "timeout", "auth", "bad_payload", "stale"})

# The leak indicator's text and colour level per detector state, in one place.
LEAK_LABEL: dict[str, str] = {"warmup": "…", "ok": "OK", "watch": "WATCH", "leak": "LEAK"}
LEAK_LEVEL: dict[str, Level] = {"warmup": "dim", "ok": "ok", "watch": "warn", "leak": "alarm"}
LEAK_RANK: dict[str, int] = {"warmup": 0, "ok": 0, "watch": 1, "leak": 2}


@dataclass(slots=True, eq=False)
class FleetRow:
    key: str  # stable across refreshes: url plus engine
    url: str
    engine: EngineKey | None  # None for a row that stands for the whole target
    name: str
    state: TargetState = field(repr=False)
    stats: EngineStats | None = field(repr=False)  # None for a target without engines
    status: Cell
    sort_values: dict[str, float | None] = field(default_factory=dict)
    search: str = ""  # lower-case text the filter matches
    gpu: Cell = NO_GPU  # the GPU column: changes with GPU reads, not with the server's state
    _cells: dict[str, Cell] | None = field(default=None, repr=False)

    @property
    def cells(self) -> dict[str, Cell]:
        """Column key -> cell; made on first use, so only rows drawn pay for formatting."""
        if self._cells is None:
            cells = _empty_cells(self.state) if self.stats is None else engine_cells(self.stats)
            self._cells = cells | {"name": Cell(self.name), "status": self.status,
                                   "gpu": self.gpu}
        return self._cells

    def set_gpu(self, cell: Cell) -> None:
        """A new GPU cell; the cells become a new dict, so the table sees the row changed."""
        if cell != self.gpu:
            self.gpu = cell
            if self._cells is not None:
                self._cells = self._cells | {"gpu": cell}


def row_key(url: str, engine: EngineKey | None) -> str:
    if engine is None:
        return url
    return f"{url}|{engine[0] or ''}|{engine[1] or ''}"


def status_cell(state: TargetState, now: float) -> Cell:
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
    if status == "stale":
        return Cell(f"stale {fmt.age(ago)}", "warn")
    label = "bad data" if status == "bad_payload" else status
    return Cell(label if ago is None else f"{label} {fmt.age(ago)}", "bad")


def _kv_level(usage: float | None) -> Level | None:
    if usage is None:
        return None
    if usage >= 0.95:
        return "bad"
    return "warn" if usage >= 0.8 else None


def _usage(stats: EngineStats) -> float | None:
    if stats.kv_usage is not None:
        return stats.kv_usage
    if stats.blocks_used is not None and stats.blocks_total:
        return stats.blocks_used / stats.blocks_total
    return None


def _engine_suffix(stats: EngineStats, engines: list[EngineStats]) -> str:
    if len(engines) < 2:
        return ""
    if len({e.model for e in engines}) == 1:
        return f" e{display_text(stats.engine)}" if stats.engine is not None else ""
    parts = [p for p in (stats.model, stats.engine) if p]
    return " " + display_text("/".join(parts))


def leak_cell(verdict: LeakVerdict | None) -> Cell:
    """``LEAK +420/h``: the state, and the floor's slope once a rising floor is measured."""
    if verdict is None:
        return Cell(fmt.DASH, "dim")
    text = LEAK_LABEL[verdict.state]
    slope = verdict.slope_blocks_per_hour
    if verdict.state in ("watch", "leak") and slope is not None and slope > 0:
        text = f"{text} {fmt.slope(slope)}"
    return Cell(text, LEAK_LEVEL[verdict.state])


def _leak_rank(stats: EngineStats) -> float | None:
    return None if stats.leak is None else LEAK_RANK[stats.leak.state]


def _worst(state: TargetState, stats: EngineStats | None) -> float | None:
    """LEAK, then WATCH, then unreachable or stale; within each, the fullest KV first."""
    if state.status == "pending":
        return None
    verdict = stats.leak if stats is not None else None
    if verdict is not None and verdict.state in ("leak", "watch"):
        rank = 2 + LEAK_RANK[verdict.state]
    else:
        rank = 1 if state.status in PROBLEM_STATUSES else 0
    usage = _usage(stats) if stats is not None else None
    return 2 * rank + min(usage or 0.0, 1.0)  # usage never crosses into the next rank


def engine_cells(stats: EngineStats) -> dict[str, Cell]:
    usage = _usage(stats)
    ttft = stats.ttft
    waiting = stats.waiting
    preempt = stats.preemptions_per_s
    return {
        "model": Cell(display_text(stats.model) if stats.model else fmt.DASH),
        "leak": leak_cell(stats.leak),
        "kv": Cell(fmt.kv_cell(usage, stats.blocks_used, stats.blocks_total), _kv_level(usage)),
        "running": Cell(fmt.count(stats.running)),
        "waiting": Cell(fmt.count(waiting), "warn" if waiting else None),
        "preempt": Cell(fmt.rate(preempt), "bad" if preempt else None),
        "hit": Cell(fmt.percent(stats.hit_rate)),
        "prompt": Cell(fmt.rate(stats.prompt_tps)),
        "gen": Cell(fmt.rate(stats.generation_tps)),
        "ttft": Cell(
            fmt.DASH if ttft is None else f"{fmt.seconds(ttft.p50)}/{fmt.seconds(ttft.p99)}"
        ),
    }


def _empty_cells(state: TargetState) -> dict[str, Cell]:
    """Cells for a target with no engine to show: say why instead of drawing zeros."""
    gpus = len(state.gpus) if state.kind in GPU_EXPORTER_KINDS else 0
    return _cells_without_engines(state.status, state.kind, state.error, gpus)


@lru_cache(maxsize=1024)
def _cells_without_engines(status: str, kind: str | None, error: str | None,
                           gpus: int) -> dict[str, Cell]:
    """Shared (treat as read-only): 10,000 targets down for one reason are one dict."""
    cells = {c.key: Cell(fmt.DASH, "dim") for c in (*COLUMNS, GPU_COLUMN)}
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


def target_rows(state: TargetState, status: Cell) -> list[FleetRow]:
    """A target's rows: one per engine, or one that says why there is none."""
    target = state.target
    label = shown_label(target)
    base_search = " ".join(
        str(p) for p in (label, target.url, target.group, state.kind, status.text) if p
    )
    if not state.engines:
        row = FleetRow(key=row_key(target.url, None), url=target.url, engine=None, name=label,
                       state=state, stats=None, status=status,
                       sort_values={"worst": _worst(state, None)})
        row.search = f"{base_search} {row.cells['model'].text}".lower()  # the reason it's empty
        return [row]
    rows = []
    for stats in state.engines:
        name = label + _engine_suffix(stats, state.engines)
        engine: EngineKey = (stats.model, stats.engine)
        rows.append(FleetRow(
            key=row_key(target.url, engine), url=target.url, engine=engine, name=name,
            state=state, stats=stats, status=status,
            sort_values={
                "kv": _usage(stats),
                "waiting": stats.waiting,
                "preempt": stats.preemptions_per_s,
                "gen": stats.generation_tps,
                "leak": _leak_rank(stats),
                "worst": _worst(state, stats),
            },
            search=f"{base_search} {name} {stats.model or ''}".lower(),
        ))
    return rows


def order_rows(rows: list[FleetRow], sort_key: str) -> list[FleetRow]:
    """Name ascending, or a number descending with unknowns last."""
    if sort_key == "name":
        return sorted(rows, key=lambda r: r.name.lower())

    def key(row: FleetRow) -> tuple[bool, float, str]:
        value = row.sort_values.get(sort_key)
        return (value is None, -(value or 0.0), row.name.lower())

    return sorted(rows, key=key)


def filter_rows(rows: list[FleetRow], text: str) -> list[FleetRow]:
    """Rows whose name, model, URL, group, kind or status contains every word of ``text``."""
    words = text.lower().split()
    return [r for r in rows if all(w in r.search for w in words)]


@dataclass(frozen=True, slots=True)
class FleetSummary:
    hosts_up: int
    hosts_total: int
    blocks_used: float | None  # summed over engines that report both used and total
    blocks_total: int | None
    running: float
    waiting: float
    leaks: int = 0  # engines whose indicator says LEAK
    watches: int = 0  # ... and WATCH
    judged: int = 0  # engines past the detector's warmup

    @property
    def kv_usage(self) -> float | None:
        """Fleet KV use weighted by capacity: a big pool counts more than a small one."""
        if not self.blocks_total or self.blocks_used is None:
            return None
        return self.blocks_used / self.blocks_total


def summarise(states: list[TargetState]) -> FleetSummary:
    used = 0.0
    total = 0
    running = waiting = 0.0
    leak_states: list[str] = []
    for state in states:
        if state.status not in ("up", "stale"):
            continue
        for stats in state.engines:
            usage = _usage(stats)
            if stats.blocks_total and usage is not None:
                used += stats.blocks_used if stats.blocks_used is not None else (
                    usage * stats.blocks_total
                )
                total += stats.blocks_total
            running += stats.running or 0.0
            waiting += stats.waiting or 0.0
            if stats.leak is not None:
                leak_states.append(stats.leak.state)
    return FleetSummary(
        hosts_up=sum(1 for s in states if s.status == "up"),
        hosts_total=len(states),
        blocks_used=used if total else None,
        blocks_total=total or None,
        running=running,
        waiting=waiting,
        leaks=leak_states.count("leak"),
        watches=leak_states.count("watch"),
        judged=len(leak_states) - leak_states.count("warmup"),
    )


@dataclass(frozen=True, slots=True)
class LeakChange:
    """An engine whose indicator moved between OK, WATCH and LEAK: worth one notification."""

    key: str
    name: str
    verdict: LeakVerdict


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
