"""The fleet view's rows: target states -> one row per engine (or one per target that has
none), in the order and under the filter asked for.

Pure functions of the states and a clock, so the table widget only draws and the rules
(names, sort order, what a filter finds) are tested without a terminal. A row's cells
(``kvtop.view.cells``) and its number for a sort key (``kvtop.view.sort_keys``) are worked
out the first time they are asked for: a frame of 500 rows pays only for what it shows.
Target labels and engine names are made safe (``display_text``) here, once per scrape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from kvtop.safe_text import display_text
from kvtop.view.cells import (
    NO_DELTA,
    NO_GPU,
    Cell,
    empty_cells,
    engine_cells,
    status_cell,
)
from kvtop.view.sort_keys import TEXT_SORTS, engine_sort_value

if TYPE_CHECKING:
    from kvtop.collect.target import Target
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import EngineKey, TargetState


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
                cells = empty_cells(self.state)
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
            self.sort_values[key] = engine_sort_value(key, self.state, self.stats)
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


def engine_suffix(stats: EngineStats, engines: list[EngineStats]) -> str:
    """What tells one server's engines apart: " e1" for data-parallel ranks of one model."""
    if len(engines) < 2:
        return ""
    if len({e.model for e in engines}) == 1:
        return f" e{display_text(stats.engine, 12)}" if stats.engine is not None else ""
    parts = [p for p in (stats.model, stats.engine) if p]
    return " " + display_text("/".join(parts))


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
        suffix = engine_suffix(stats, state.engines)
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
