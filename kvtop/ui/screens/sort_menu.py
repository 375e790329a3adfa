"""F6: the sort menu, as htop has it: pick the column the fleet is sorted by."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from kvtop.view.sort_keys import SORT_LABELS
from kvtop.view.view_state import sort_marker


class SortMenu(ModalScreen["str | None"]):
    """Returns the sort key chosen, or None; the current one again turns the order round.
    The current key carries the header's marker (▲ smallest or A first, ▼ biggest)."""

    BINDINGS = [  # noqa: RUF012 - Textual's class-level binding list
        Binding("escape,f6,q", "dismiss(None)", "Close"),
    ]

    def __init__(self, current: str, ascending: bool) -> None:
        super().__init__()
        self._current = current
        self._ascending = ascending

    def compose(self) -> ComposeResult:
        options = []
        for key, label in SORT_LABELS.items():
            mark = f" {sort_marker(self._ascending)}" if key == self._current else ""
            options.append(Option(f"{label}{mark}", id=key))
        with Vertical(id="sort-body"):
            yield Static("Sort by  (the same again: the other way round)", id="sort-title")
            yield OptionList(*options, id="sort-options")

    def on_mount(self) -> None:
        menu = self.query_one(OptionList)
        menu.highlighted = list(SORT_LABELS).index(self._current)
        menu.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)
