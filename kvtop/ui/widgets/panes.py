"""The selected engine's live panes on the main screen: a few lines of verdicts over the
charts (KV blocks, requests, hit rate, tokens/s, latency), each drawn at its own size."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from kvtop.view.chart import render
from kvtop.view.engine import EngineView, Line, PaneView

ROLES = ("title", "key", "axis", "ticks", "s1", "s2", "s3", "floor", "base", "ok", "warn",
         "bad", "alarm", "dim")


class Styled(Widget):
    """Pieces (text, role) to Rich text with the widget's component styles."""

    PREFIX = ""
    _styles: dict[str, Style]

    def role_style(self, role: str) -> Style | None:
        if not role:
            return None
        style = self._styles.get(role)
        if style is None:
            try:
                style = self.get_component_rich_style(f"{self.PREFIX}--{role}")
            except KeyError:  # the app is tearing down: its stylesheet is gone
                return None
            self._styles[role] = style
        return style

    def line_text(self, line: Line) -> Text:
        """A border title (kept as markup) or a line its widget joins into a Text of its own
        (EngineHead, EnginePanel, CachePane): either way the cut at the edge is the
        stylesheet's (text-wrap, text-overflow)."""
        text = Text()
        for piece, role in line:
            text.append(piece, self.role_style(role))
        return text


class ChartPane(Styled):
    """One chart with its legend as the border title and its latest values under it.

    Drawn line by line (Textual's line API): the chart's rows become strips directly, once
    per new view or size, without going through Rich text and Textual's content layout
    (at 160x48 that conversion was most of the panes' cost)."""

    COMPONENT_CLASSES = {f"pane--{role}" for role in ROLES}  # noqa: RUF012
    PREFIX = "pane"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._styles = {}
        self._view: PaneView | None = None
        self._empty = ""  # said where there is no view
        self._strips: tuple[Size, list[Strip]] | None = None  # drawn at that size

    def show(self, view: PaneView | None, empty: str = "") -> None:
        """Draw ``view`` (None: say ``empty``); what did not change is left alone (a title
        costs a layout)."""
        old, self._view = self._view, view
        if old is not None and view is not None and old == view:
            return
        if view is None and old is None and empty == self._empty:
            return
        self._empty = empty
        if old is None or view is None or old.legend != view.legend:
            self.border_title = self.line_text(view.legend) if view else None
        if old is None or view is None or old.latest != view.latest:
            self.border_subtitle = self.line_text(view.latest) if view else None
        self._strips = None
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._strips = None

    def render_line(self, y: int) -> Strip:
        """Drawn at the size the pane has now: a resize redraws the chart at once."""
        size = self.content_size
        if self._strips is None or self._strips[0] != size:
            self._strips = (size, self._draw(size.width, size.height))
        strips = self._strips[1]
        return strips[y] if y < len(strips) else Strip.blank(size.width, self.rich_style)

    def _draw(self, width: int, height: int) -> list[Strip]:
        view = self._view
        if view is None:  # a server that never answered, a search that left no row
            lines: list[Line] = [[(self._empty, "dim")]]  # "": a blank line, as no line
        else:
            rows = render(view.chart, width, height) if view.chart is not None else []
            lines = rows or [[(view.empty, "dim")]]
        base = self.rich_style
        strips = []
        for line in lines:
            segments = [Segment(piece, base + self.role_style(role)) for piece, role in line]
            strips.append(Strip(Segment.simplify(segments)).extend_cell_length(width, base)
                          .crop(0, width))
        return strips


class EngineHead(Styled, Static):
    """The verdict lines over the charts: status, leak, stall, LoRA."""

    COMPONENT_CLASSES = {f"pane--{role}" for role in ROLES}  # noqa: RUF012
    PREFIX = "pane"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._styles = {}
        self._shown: Text | None = None

    def show(self, lines: list[Line]) -> None:
        text = Text("\n").join(self.line_text(line) for line in lines)
        if text != self._shown:
            self._shown = text
            self.update(text)


class EnginePanes(Vertical):
    """The panes of the selected engine; ``beside_kv`` (the cache and GPU panes) right of
    the KV chart, in that order."""

    PANE_KEYS = ("kv", "queue", "hit", "tps", "lat")

    def __init__(self, *beside_kv: Widget, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._beside_kv = beside_kv
        self._panes: dict[str, ChartPane] = {}
        self._title: str | None = None

    def compose(self) -> ComposeResult:
        yield EngineHead(id="engine-head")
        with Horizontal(id="panes-top"):
            yield ChartPane(id="pane-kv", classes="pane")
            yield from self._beside_kv
        with Grid(id="panes-grid"):
            for key in self.PANE_KEYS[1:]:
                yield ChartPane(id=f"pane-{key}", classes="pane")

    def on_mount(self) -> None:
        self.head = self.query_one(EngineHead)
        self._panes = {key: self.query_one(f"#pane-{key}", ChartPane) for key in self.PANE_KEYS}

    def show(self, view: EngineView) -> None:
        if view.title != self._title:
            self._title = view.title
            self.border_title = Text(view.title)  # a Text: a name is never read as markup
        self.head.show(view.lines)
        for widget in self._beside_kv:  # those that draw the engine (the cache pane) do
            show_engine = getattr(widget, "show_engine", None)
            if show_engine is not None:
                show_engine(view)
        panes = {pane.key: pane for pane in view.panes}
        for key, widget in self._panes.items():
            widget.show(panes.get(key), view.empty)
