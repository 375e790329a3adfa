"""What the person asked the fleet view to show: the sort, the groups (and which are
closed), the search, pause, and whether the GPU pane is wanted. The app's keys change it and
each frame reads it; it holds no rows, so it is tested without a terminal."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvtop.view.cells import COLUMNS
from kvtop.view.fleet import FleetRow, filter_rows, order_rows
from kvtop.view.groups import NONE, group_modes, group_rows, mode_label
from kvtop.view.sort_keys import COLUMN_SORT, LARGE_FLEET, SORT_CYCLE, SORT_LABELS, TEXT_SORTS

COLUMN_KEYS = frozenset(c.key for c in COLUMNS)


def sort_marker(ascending: bool) -> str:
    """▲ smallest (or A) first, ▼ biggest first: one marker on the header, the column and
    the F6 menu."""
    return "▲" if ascending else "▼"


@dataclass
class ViewState:
    sort_key: str = "name"
    sort_reverse: bool = False
    sort_chosen: bool = False  # until a sort is chosen, the fleet's size picks the order
    group_mode: str = NONE
    collapsed: set[str] = field(default_factory=set)  # aggregate rows' keys of closed groups
    filter_text: str = ""
    paused: bool = False
    gpu_wanted: bool = True  # `g` hides the GPU pane

    # -- what a frame shows ---------------------------------------------------------------

    def shown(self, rows: list[FleetRow]) -> list[FleetRow]:
        """The rows the search leaves (the header counts these). Until a sort is chosen, a
        fleet of more than LARGE_FLEET rows is sorted worst first, a smaller one by name."""
        if not self.sort_chosen:
            self.sort_key = "worst" if len(rows) > LARGE_FLEET else "name"
        return filter_rows(rows, self.filter_text)

    def arrange(self, rows: list[FleetRow]) -> list[FleetRow]:
        """``rows`` in the sort's order, under their groups' aggregate rows."""
        ordered = order_rows(rows, self.sort_key, self.sort_reverse)
        return group_rows(ordered, self.group_mode, self.collapsed, self.sort_key,
                          self.sort_reverse)

    @property
    def sort_column(self) -> str:
        """The column whose header carries the sort marker: the sort's own column, else the
        one whose click asks for it (worst first: STATUS)."""
        if self.sort_key in COLUMN_KEYS:  # WAIT keeps its marker though LIMIT sorts by it
            return self.sort_key
        return next((c for c, k in COLUMN_SORT.items() if k == self.sort_key), self.sort_key)

    @property
    def ascending(self) -> bool:
        """A-Z or smallest first (the marker's ▲): names sort up, numbers down by default."""
        return (self.sort_key in TEXT_SORTS) != self.sort_reverse

    @property
    def sort_label(self) -> str:
        """``name ▲``: the key and the same marker as its column's header and the F6 menu."""
        return f"{SORT_LABELS[self.sort_key]} {sort_marker(self.ascending)}"

    @property
    def group_label(self) -> str:
        return "" if self.group_mode == NONE else mode_label(self.group_mode)

    # -- what the keys change -------------------------------------------------------------

    def sort_by(self, key: str, reverse: bool | None = None) -> None:
        """Sort by ``key``; the key already sorted by again turns the order round."""
        if reverse is None:
            reverse = not self.sort_reverse if key == self.sort_key else False
        self.sort_key, self.sort_reverse, self.sort_chosen = key, reverse, True

    def next_sort(self) -> None:
        """`o`: the next of the usual sort keys, in its natural order."""
        index = SORT_CYCLE.index(self.sort_key) if self.sort_key in SORT_CYCLE else -1
        self.sort_by(SORT_CYCLE[(index + 1) % len(SORT_CYCLE)], reverse=False)

    def next_group_mode(self, rows: Iterable[FleetRow]) -> None:
        """F5: no groups, config group, model, then each label the ``rows`` carry."""
        modes = group_modes(rows)
        index = modes.index(self.group_mode) if self.group_mode in modes else -1
        self.group_mode = modes[(index + 1) % len(modes)]

    def toggle_group(self, key: str, open_: bool | None) -> bool:
        """Open or close the group ``key`` (None: the other way round); False when it
        already was as asked."""
        closed = key in self.collapsed
        if open_ is not None and open_ != closed:
            return False
        self.collapsed.symmetric_difference_update({key})
        return True

    def search(self, text: str) -> None:
        self.filter_text = text.strip()
