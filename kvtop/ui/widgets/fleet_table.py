"""The fleet table: a header and one line per (target, engine), drawn only where seen.

A Line-API :class:`ScrollView`: Textual asks for the lines on screen and nothing else, so
500 engines cost what the 20 visible ones cost. Each row's line is cached while its cells
are equal, and a new frame repaints only the screen lines whose row changed.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kvtop.view.cells import Cell, Column, visible_columns
from kvtop.view.fleet import FleetRow

SCROLLBAR_W = 1  # the vertical scrollbar's cells (kvtop.tcss), kept free for it
ELLIPSIS = "…"
MAX_STRIPS = 1024  # cached row lines (a few screens' worth); then start afresh


def fit(text: str, width: int, keep: int = 0) -> str:
    """``text`` padded or cut (with an ellipsis) to exactly ``width`` cells; the last
    ``keep`` characters survive a cut (``llama-70b-prod-… e1``)."""
    size = len(text) if text.isascii() else cell_len(text)
    if size <= width:
        return text + " " * (width - size)
    tail = text[len(text) - keep:] if keep < width - 1 else ""  # keep=0: text[len:] is ""
    # the text cut to the cells left: wider than the width, it never reaches the tail
    return set_cell_size(text, width - 1 - cell_len(tail)) + ELLIPSIS + tail


def header_text(columns: list[Column], sorted_by: str, ascending: bool) -> str:
    """The header's labels, the sorted column's marked ▲ (smallest or A first) or ▼: the
    marker survives a label cut to make room for it."""
    marker = "▲" if ascending else "▼"
    return "".join(_padded(fit(c.label[:c.width - 1] + marker, c.width) if c.key == sorted_by
                           else fit(c.label, c.width), c) for c in columns)


def _padded(text: str, column: Column) -> str:
    """A cell's text with the column's spaces around it."""
    return f" {text}" + " " * (column.pad - 1)


def cell_text(cell: Cell, width: int) -> str:
    """The cell in ``width`` cells: its short form where the text is wider (a narrowed
    column), else the text, cut if it must be."""
    text = cell.text
    if cell.short is not None and cell_len(text) > width:
        text = cell.short
    return fit(text, width, cell.keep)


def column_at(columns: list[Column], x: int) -> str | None:
    """The key of the column drawn at cell ``x`` (None: right of the last one)."""
    start = 0
    for column in columns:
        end = start + column.width + column.pad
        if start <= x < end:
            return column.key
        start = end
    return None


class FleetTable(ScrollView, can_focus=True):
    """Shows the rows it is given, in that order; keeps the cursor on the same row key."""

    COMPONENT_CLASSES = {  # noqa: RUF012 - Textual's class-level set
        "fleet--header", "fleet--cursor",
        "fleet--ok", "fleet--warn", "fleet--bad", "fleet--alarm", "fleet--dim",
    }
    BINDINGS = [  # noqa: RUF012 - Textual's class-level binding list
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "cursor_to(0)", "First", show=False),
        Binding("end", "cursor_to(-1)", "Last", show=False),
        Binding("enter", "select", "Detail"),
        Binding("left", "toggle_group(False)", "Close group", show=False),
        Binding("right", "toggle_group(True)", "Open group", show=False),
    ]

    class RowHighlighted(Message):
        """The cursor moved to another row (by key or mouse)."""

        def __init__(self, table: FleetTable) -> None:
            super().__init__()
            self.table = table

        @property
        def control(self) -> FleetTable:  # what @on(..., "#fleet") matches
            return self.table

    class RowSelected(RowHighlighted):
        """Enter (or a click) on the cursor's row."""

    class HeaderClicked(RowHighlighted):
        """A click on a column's header: sort by it (again: the other way round)."""

        def __init__(self, table: FleetTable, column: str) -> None:
            super().__init__(table)
            self.column = column

    class GroupToggled(RowHighlighted):
        """Open or close the group whose aggregate row has the cursor."""

        def __init__(self, table: FleetTable, key: str, open_: bool | None) -> None:
            super().__init__(table)
            self.key = key
            self.open = open_  # None: the other way round

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._columns: list[Column] = []
        self._rows: list[FleetRow] = []
        self._cursor = 0
        self._strips: dict[tuple[str, bool], tuple[dict[str, Cell], Strip]] = {}
        self._header: Strip | None = None
        self._styles: dict[str, Style] = {}
        self._gpu_column = False
        self._delta_column = False
        self._sorted: tuple[str, bool] = ("", False)  # (column key, ascending) for the marker

    # -- what the app uses ----------------------------------------------------------------

    @property
    def selected_row(self) -> FleetRow | None:
        return self._rows[self._cursor] if self._rows else None

    @property
    def rows(self) -> list[FleetRow]:
        return self._rows

    @property
    def columns(self) -> list[Column]:
        return self._columns

    def show(self, rows: list[FleetRow]) -> None:
        """Show ``rows`` in this order; repaint only the screen lines that change. The
        view follows the selected row only while it is on screen: a table scrolled away
        with the mouse wheel stays where it was put."""
        before = self._visible_lines()
        selected = self.selected_row
        following = self._cursor_visible()
        self._rows = rows
        self._cursor = self._index_of(selected)
        if len(self._strips) > MAX_STRIPS:  # rows scrolled past or gone: start afresh
            self._strips.clear()
        if self.virtual_size.height != len(rows) + 1:
            self._set_virtual_size()
        if following:
            self._scroll_to_cursor()
        self._refresh_changed(before)

    def show_sort(self, column: str, ascending: bool) -> None:
        """Mark the column the rows are sorted by: ▲ smallest (or A) first, ▼ biggest."""
        if (column, ascending) != self._sorted:
            self._sorted = (column, ascending)
            self._header = None
            self.refresh(Region(0, 0, self.size.width, 1))

    @property
    def columns_with_gpu(self) -> bool:
        return self._gpu_column

    def show_gpu_column(self, shown: bool) -> None:
        """The optional GPU memory column: on once some server has a GPU of its own."""
        if shown != self._gpu_column:
            self._gpu_column = shown
            self._fit_columns()

    def show_delta_column(self, shown: bool) -> None:
        """The optional baseline column: on when a baseline is drawn (--baseline)."""
        if shown != self._delta_column:
            self._delta_column = shown
            self._fit_columns()

    # -- geometry -------------------------------------------------------------------------

    def on_resize(self, event: events.Resize) -> None:
        self._fit_columns()

    def _fit_columns(self) -> None:
        width = max(self.size.width - SCROLLBAR_W, 0)
        columns = visible_columns(width, gpu=self._gpu_column, delta=self._delta_column)
        if columns != self._columns:
            self._columns = columns
            self._forget_rendering()
            self._set_virtual_size()

    def _set_virtual_size(self) -> None:
        width = sum(c.width + c.pad for c in self._columns)
        self.virtual_size = Size(width, len(self._rows) + 1)
        self.refresh(layout=True)  # height is auto: the table takes the rows it needs

    @property
    def _page(self) -> int:
        return max(self.scrollable_content_region.height - 1, 1)  # less the header

    def _cursor_visible(self) -> bool:
        top = round(self.scroll_y)
        return top <= self._cursor < top + self._page

    def _scroll_to_cursor(self) -> None:
        top = round(self.scroll_y)
        if self._cursor < top:
            self.scroll_to(y=self._cursor, animate=False, force=True)
        elif self._cursor >= top + self._page:
            self.scroll_to(y=self._cursor - self._page + 1, animate=False, force=True)

    def _index_of(self, row: FleetRow | None) -> int:
        """The selected row's new place; if it is gone, the cursor stays where it was."""
        if row is not None:
            for index, candidate in enumerate(self._rows):
                if candidate.key == row.key:
                    return index
        return min(self._cursor, max(len(self._rows) - 1, 0))

    # -- cursor ---------------------------------------------------------------------------

    def _move(self, index: int) -> None:
        if not self._rows:
            return
        index = min(max(index, 0), len(self._rows) - 1)
        if index == self._cursor:
            return
        old, self._cursor = self._cursor, index
        self._scroll_to_cursor()
        for row in (old, index):
            self.refresh(Region(0, row - round(self.scroll_y) + 1, self.size.width, 1))
        self.post_message(self.RowHighlighted(self))

    def action_cursor(self, step: int) -> None:
        self._move(self._cursor + step)

    def action_page(self, step: int) -> None:
        self._move(self._cursor + step * self._page)

    def action_cursor_to(self, index: int) -> None:
        self._move(index if index >= 0 else len(self._rows) - 1)

    def action_select(self) -> None:
        row = self.selected_row
        if row is not None and row.is_group:  # enter opens or closes a group
            self.post_message(self.GroupToggled(self, row.key, None))
        elif row is not None:
            self.post_message(self.RowSelected(self))

    def action_toggle_group(self, open_: bool | None = None) -> None:
        row = self.selected_row
        if row is not None and row.is_group:
            self.post_message(self.GroupToggled(self, row.key, open_))

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            column = column_at(self._columns, event.x)  # lines are drawn from their first cell
            if column is not None:
                self.post_message(self.HeaderClicked(self, column))
            return
        index = round(self.scroll_y) + event.y - 1
        if not 0 <= index < len(self._rows):
            return
        row = self._rows[index]
        if row.is_group and event.x <= 2:  # the ▸/▾ marker
            self._move(index)
            self.post_message(self.GroupToggled(self, row.key, None))
        elif index == self._cursor:
            self.action_select()
        else:
            self._move(index)

    # -- drawing --------------------------------------------------------------------------

    def _visible_lines(self) -> list[tuple[str, dict[str, Cell]]]:
        top = round(self.scroll_y)
        return [(r.key, r.cells) for r in self._rows[top:top + self._page]]

    def _refresh_changed(self, before: list[tuple[str, dict[str, Cell]]]) -> None:
        """Repaint the lines whose row (or its cells) differ from what was on screen."""
        after = self._visible_lines()
        width = self.size.width
        for y in range(max(len(before), len(after))):
            old = before[y] if y < len(before) else None
            new = after[y] if y < len(after) else None
            if old is None or new is None or old[0] != new[0] or old[1] != new[1]:
                self.refresh(Region(0, y + 1, width, 1))

    def notify_style_update(self) -> None:
        super().notify_style_update()  # focus, theme: the cursor and colours change
        self._forget_rendering()

    def _forget_rendering(self) -> None:
        self._strips.clear()
        self._styles.clear()
        self._header = None
        self.refresh()

    def _style(self, name: str) -> Style:
        """The widget's own style ("base") or a component's, computed once per style change."""
        style = self._styles.get(name)
        if style is None:
            style = self.rich_style if name == "base" else self._component_style(name)
            self._styles[name] = style
        return style

    def _component_style(self, name: str) -> Style:
        try:
            style = self.get_component_rich_style(f"fleet--{name}")
        except KeyError:  # the app is tearing down: its stylesheet is gone
            return Style.null()
        if name in ("header", "cursor"):
            return style
        return Style(color=style.color, bold=style.bold, reverse=style.reverse)  # text only

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            return self._header_strip(width)
        index = round(self.scroll_y) + y - 1
        if not 0 <= index < len(self._rows):
            return Strip.blank(width, self._style("base"))
        return self._row_strip(self._rows[index], index == self._cursor, width)

    def _header_strip(self, width: int) -> Strip:
        if self._header is None or self._header.cell_length != width:
            text = header_text(self._columns, *self._sorted)
            self._header = Strip([Segment(fit(text, width), self._style("header"))], width)
        return self._header

    def _row_strip(self, row: FleetRow, cursor: bool, width: int) -> Strip:
        cached = self._strips.get((row.key, cursor))
        if cached is not None and cached[0] == row.cells and cached[1].cell_length == width:
            return cached[1]
        plain = self._style("base")
        base = plain + self._style("cursor") if cursor else plain
        segments = []
        for column in self._columns:
            cell = row.cells[column.key]
            text = cell_text(cell, column.width)
            after = " " * (column.pad - 1)
            if cell.level is None:
                segments.append(Segment(f" {text}{after}", base))
                continue
            # State colours stay on the cursor's row too: a LEAK cell is red when selected.
            shown = text.rstrip(" ")  # padding stays plain: a LEAK badge is its text only
            segments += [Segment(" ", base), Segment(shown, base + self._style(cell.level)),
                         Segment(text[len(shown):] + after, base)]
        strip = Strip(Segment.simplify(segments)).extend_cell_length(width, plain).crop(0, width)
        self._strips[(row.key, cursor)] = (row.cells, strip)
        return strip
