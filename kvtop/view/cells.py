"""A fleet row's cells and the table's columns: what each number looks like, what "unknown"
looks like (a dash, never 0), and which columns a terminal's width keeps.

This is where the app's text from outside (model names, error messages) crosses the display
boundary: every such string in a cell is made safe by :func:`~kvtop.safe_text.display_text`
here, once per scrape when the rows are built, and the widgets draw the cells' text as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from kvtop.collect.reading import GPU_EXPORTER_KINDS
from kvtop.safe_text import display_text
from kvtop.view import format as fmt

if TYPE_CHECKING:
    from kvtop.baseline.overlay import Delta
    from kvtop.derive.stats import EngineStats, Quantiles
    from kvtop.derive.tracker import TargetState
    from kvtop.derive.verdicts import LeakVerdict, StallVerdict

Level = Literal["ok", "warn", "bad", "alarm", "dim"]
NOT_INFERENCE = "not an inference server?"
NARROW_BAR = 3  # cells of the KV bar in a narrowed KV column
RESTART_BADGE_S = 300.0  # how long a restart stays flagged in the status column


@dataclass(frozen=True, slots=True)
class Cell:
    text: str
    level: Level | None = None  # mapped to a style by the table's .tcss component classes
    keep: int = 0  # last characters that survive when the cell is cut (a DP engine's " e1")
    short: str | None = None  # what a narrowed column shows instead of cutting ``text``


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int
    priority: int  # lower survives longer when the terminal is narrow
    narrow: int = 0  # the width it shrinks to on a small terminal (0: its width)
    narrow_label: str = ""  # its label then ("": the label)
    pad: int = 2  # spaces around it: one each side; narrowed, one before (as htop's)

    def narrowed(self) -> Column:
        return Column(self.key, self.narrow_label or self.label, self.narrow or self.width,
                      self.priority, pad=1)


COLUMNS: tuple[Column, ...] = (
    Column("name", "NAME", 16, 0),
    Column("model", "MODEL", 24, 5),
    Column("status", "STATUS", 11, 0),  # "timeout 12s" keeps its age
    Column("kv", "KV BLOCKS", 17, 0, narrow=15),  # a 3-cell bar: "█▌░ 10.1k/20.2k"
    Column("leak", "LEAK", 12, 0, narrow=9),  # never dropped; narrow: the state alone
    Column("running", "RUN", 4, 1),
    Column("waiting", "WAIT", 4, 1),
    Column("limit", "LIMIT", 8, 2),  # what holds the queue back (derive/limits.py)
    Column("preempt", "PRE/s", 5, 3),
    Column("hit", "HIT", 5, 2),
    Column("prompt", "PP t/s", 6, 4),
    Column("gen", "GEN t/s", 7, 2, narrow=5, narrow_label="GEN/s"),
    Column("ttft", "TTFT 50/99", 11, 3),
)
NARROW_AFTER = 3  # columns of a priority above this go before the others are narrowed
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
    def fits() -> bool:
        return sum(c.width + c.pad for c in shown) <= width

    by_priority = sorted(shown, key=lambda c: -c.priority)
    for column in by_priority:
        if fits() or column.priority <= NARROW_AFTER:
            break
        shown.remove(column)
    if not fits():  # 80x24: HIT and GEN beside the verdict, one space apart as in htop
        shown = [c.narrowed() for c in shown]
    for column in by_priority:
        if fits() or column.priority == 0:
            break
        shown = [c for c in shown if c.key != column.key]  # those above NARROW_AFTER: gone
    return shown


FAILURE_LABEL: dict[str, str] = {"down": "down", "timeout": "timeout", "auth": "auth",
                                 "bad_payload": "bad data"}
NOT_FOUND = "HTTP 404"  # how the poller's message for a 404 starts

# The leak indicator's text and colour level per detector state, in one place.
# One name per state, on every screen (the JSON contracts spell them in lower case).
LEAK_LABEL: dict[str, str] = {"warmup": "WARMUP", "ok": "OK", "watch": "WATCH", "leak": "LEAK"}
LEAK_LEVEL: dict[str, Level] = {"warmup": "dim", "ok": "ok", "watch": "warn", "leak": "alarm"}


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
    label = LEAK_LABEL[verdict.state]
    slope = verdict.slope_blocks_per_hour
    if verdict.state in ("watch", "leak") and slope is not None and slope > 0:
        return Cell(f"{label} {fmt.slope(slope)}", LEAK_LEVEL[verdict.state], short=label)
    return Cell(label, LEAK_LEVEL[verdict.state])


# The limit words in the LIMIT column (8 cells), and the limits that hold requests back
# (or an engine asleep), as the header counts them, in this order.
LIMIT_CELL: dict[str, str] = {
    "kv_capacity": "KV cap", "max_sequences": "max seqs", "token_budget": "budget",
    "deferred": "deferred", "kv_transfer": "KV xfer", "sleeping": "asleep", "none": "none",
    "unknown": "unknown"}
HEADER_LIMITS: dict[str, str] = {
    "kv_capacity": "KV", "max_sequences": "seqs", "token_budget": "budget",
    "deferred": "deferred", "kv_transfer": "xfer", "sleeping": "asleep"}


def limit_cell(stats: EngineStats) -> Cell:
    """What limits the engine, in a word; amber when something holds requests back."""
    verdict = stats.limit
    if verdict is None:
        return Cell(fmt.DASH, "dim")
    held = verdict.limit in HEADER_LIMITS
    return Cell(LIMIT_CELL[verdict.limit], "warn" if held else "dim")


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
        "kv": Cell(fmt.kv_cell(usage, stats.blocks_used, stats.blocks_total), _kv_level(usage),
                   short=fmt.kv_cell(usage, stats.blocks_used, stats.blocks_total, NARROW_BAR)),
        "running": Cell(fmt.count(stats.running)),
        "waiting": Cell(fmt.count(waiting), "warn" if waiting else None),
        "limit": limit_cell(stats),
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


def empty_cells(state: TargetState) -> dict[str, Cell]:
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

