"""The fleet table: one row per (target, engine), updated cell by cell."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.widgets import DataTable

from kvtop.ui.fleet import Cell, Column, FleetRow, visible_columns

MAX_RENDERED = 4096  # cached cell renderings (a few screens' worth); then start afresh


class FleetTable(DataTable):
    """Draws the rows it is given; keeps row keys so only changed cells are redrawn."""

    COMPONENT_CLASSES = DataTable.COMPONENT_CLASSES | {
        "fleet--ok",
        "fleet--warn",
        "fleet--bad",
        "fleet--alarm",
        "fleet--dim",
    }
    BINDINGS = [  # noqa: RUF012 - Textual's class-level binding list
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("enter", "select_cursor", "Detail"),  # DataTable's own is hidden from the footer
    ]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)  # type: ignore[arg-type]
        self._columns_shown: list[Column] = []
        self._rows: list[FleetRow] = []
        self._cells: dict[str, dict[str, Cell]] = {}  # what each row shows now
        self._name_cells: dict[str, Text] = {}  # for sorting by row key (see _reorder)
        self._rendered: dict[tuple[object, ...], tuple[object, list[list[Segment]]]] = {}

    @property
    def selected_row(self) -> FleetRow | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return next((r for r in self._rows if r.key == key), None)

    def show(self, rows: list[FleetRow]) -> None:
        """Make the table show ``rows`` in this order, touching only what changed."""
        self._rows = rows
        self._ensure_columns()
        selected = self.selected_row
        wanted = {r.key for r in rows}
        for key in [k for k in self._cells if k not in wanted]:
            self.remove_row(key)
            del self._cells[key]
            del self._name_cells[key]
        for row in rows:
            if row.key in self._cells:
                self._update_row(row)
            else:
                self._add_row(row)
        self._reorder(rows, selected.key if selected else None)

    def on_resize(self, event: events.Resize) -> None:
        self._ensure_columns()

    def _ensure_columns(self) -> None:
        # A scrollbar may take two cells; leave room so no column is half drawn.
        columns = visible_columns(max(self.size.width - 2, 0))
        if columns == self._columns_shown:
            return
        self._columns_shown = columns
        self.clear(columns=True)
        self._cells.clear()
        self._name_cells.clear()
        for column in columns:
            self.add_column(column.label, width=column.width, key=column.key)
        for row in self._rows:
            self._add_row(row)

    def _render(self, cell: Cell) -> Text:
        style = self.get_component_rich_style(f"fleet--{cell.level}") if cell.level else ""
        return Text(cell.text, style=style, no_wrap=True, overflow="ellipsis")

    def _add_row(self, row: FleetRow) -> None:
        texts = [self._render(row.cells[c.key]) for c in self._columns_shown]
        self.add_row(*texts, key=row.key)
        self._cells[row.key] = dict(row.cells)
        self._name_cells[row.key] = texts[0]

    def _update_row(self, row: FleetRow) -> None:
        shown = self._cells[row.key]
        for column in self._columns_shown:
            cell = row.cells[column.key]
            if shown.get(column.key) == cell:
                continue
            text = self._render(cell)
            self.update_cell(row.key, column.key, text)
            if column.key == "name":
                self._name_cells[row.key] = text
            shown[column.key] = cell

    def _reorder(self, rows: list[FleetRow], selected: str | None) -> None:
        current = [r.key.value for r in self.ordered_rows]
        order = [r.key for r in rows]
        if current == order:
            return
        # DataTable sorts by cell values; each row's name Text object identifies its row.
        position = {id(self._name_cells[key]): i for i, key in enumerate(order)}
        self.sort("name", key=lambda name: position[id(name)])
        if selected is not None and selected in self._cells:
            self.move_cursor(row=self.get_row_index(selected), animate=False)

    def _render_cell(  # type: ignore[override]
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        """DataTable re-renders every cell after any update (its cache keys on an update
        count); with 16 hosts that was most of the app's CPU. Keep each cell's rendering
        while the cell holds the very same Text object: only changed cells get new ones."""
        if row_index < 0 or column_index < 0:  # header and labels: DataTable's own cache
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        value = self._data[row_key][column_key]
        key = (row_key, column_key, row_index, base_style, width, cursor, hover,
               self._show_hover_cursor, self._pseudo_class_state)
        cached = self._rendered.get(key)
        if cached is not None and cached[0] is value:
            return cached[1]
        if len(self._rendered) > MAX_RENDERED:
            self._rendered.clear()
        lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        self._rendered[key] = (value, lines)  # holding the value keeps `is` meaningful
        return lines

