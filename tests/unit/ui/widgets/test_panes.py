"""The engine's panes mounted in a small app with kvtop's stylesheet (Pilot): the title as
written (never markup), the verdict lines in their roles' styles, each chart drawn cell by
cell at its pane's size in its series' styles, what a pane says where there is nothing to
draw, and nothing drawn again that did not change."""

from __future__ import annotations

from pathlib import Path

from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

import kvtop.ui
from kvtop.ui.widgets.panes import ROLES, ChartPane, EngineHead, EnginePanes
from kvtop.view.chart import Chart, Rule, Series, render
from kvtop.view.engine import EngineView, Line, PaneView

STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"
CHART = Chart(series=(Series("used", "s1", [(0.0, 10.0), (30.0, 40.0), (60.0, 80.0)]),),
              now=60.0, span_s=60.0, top=100.0, rules=(Rule("size", "floor", 50.0),))
KV = PaneView("kv", [("KV ", "title"), ("[b]used[/b]", "s1")], [("80", "warn")], CHART)
QUEUE = PaneView("queue", [("requests", "title")], [("run 3", "key")], None, "idle")
HEAD: list[Line] = [[("status ", "key"), ("up", "ok")], [("LEAK ", "alarm"), ("[i]no", "")]]


class Engine(Static):
    """A pane beside the KV chart that draws the engine (as the cache pane does)."""

    shown: list[EngineView]

    def show_engine(self, view: EngineView) -> None:
        self.shown = [*getattr(self, "shown", []), view]


class CountingPane(ChartPane):
    """Counts its refreshes and its charts drawn (a chart is drawn once per view and size)
    and the styles it looks up (each role once, and only roles kvtop.tcss has)."""

    refreshes = draws = 0
    looked_up: list[str]

    def get_component_rich_style(self, *names: str, partial: bool = False) -> Style:
        self.looked_up = [*getattr(self, "looked_up", []), *names]
        return super().get_component_rich_style(*names, partial=partial)

    def _draw(self, width: int, height: int) -> list[Strip]:
        self.draws += 1
        return super()._draw(width, height)

    def refresh(self, *args: object, **kwargs: object) -> ChartPane:  # type: ignore[override]
        self.refreshes += 1
        return super().refresh(*args, **kwargs)  # type: ignore[arg-type]


class CountingHead(EngineHead):
    updates = 0

    def update(self, *args: object, **kwargs: object) -> None:
        self.updates += 1
        super().update(*args, **kwargs)  # type: ignore[arg-type]


class PanesApp(App[None]):
    CSS_PATH = STYLESHEET

    def compose(self) -> ComposeResult:
        yield EnginePanes(Engine(id="beside"), Static("gpu", id="gpu"), id="panes",
                          classes="-wide")


class PaneApp(App[None]):
    CSS_PATH = STYLESHEET

    def compose(self) -> ComposeResult:
        yield CountingPane(id="pane-kv", classes="pane")
        yield CountingHead(id="engine-head", classes="-head")


def text_of(widget: ChartPane | EngineHead, line: Line) -> Text:
    """The pieces, each in its role's style in kvtop.tcss."""
    text = Text()
    for piece, role in line:
        text.append(piece, Widget.get_component_rich_style(widget, f"pane--{role}")
                    if role else None)  # not counted as the widget's own look-up
    return text


def looks(title: str | Text | None) -> list[tuple[str, object, object, bool]]:
    """Each character of a border title with its colours and weight (Textual keeps a title
    as its own markup, its colours spelt rgb(...) where Rich spells #rrggbb)."""
    text = Text.from_markup(title) if isinstance(title, str) else title
    assert text is not None
    out: list[tuple[str, object, object, bool]] = []
    for at, char in enumerate(text.plain):
        style = Style.combine(Style.parse(str(span.style)) if isinstance(span.style, str)
                              else span.style for span in text.spans
                              if span.start <= at < span.end)
        out.append((char, style.color and style.color.get_truecolor(),
                    style.bgcolor and style.bgcolor.get_truecolor(), bool(style.bold)))
    return out


def cells(strip: Strip) -> list[tuple[str, Style | None]]:
    return [(char, segment.style) for segment in strip for char in segment.text]


def want_cells(pane: ChartPane, line: Line, width: int) -> list[tuple[str, Style | None]]:
    base = pane.rich_style
    out: list[tuple[str, Style | None]] = [
        (char, base + Widget.get_component_rich_style(pane, f"pane--{role}") if role else base)
        for piece, role in line for char in piece]
    return (out + [(" ", base)] * width)[:width]


async def test_the_engine_s_title_lines_and_panes_each_where_they_belong() -> None:
    async with PanesApp().run_test(size=(100, 30)) as pilot:
        panes = pilot.app.query_one(EnginePanes)
        view = EngineView("[b]llama[/b]", HEAD, [QUEUE, KV], empty="nothing")
        panes.show(view)
        await pilot.pause()
        assert panes.border_title == "\\[b]llama\\[/b]"  # the name as written
        head = pilot.app.query_one(EngineHead)
        assert head.content == text_of(head, HEAD[0]) + Text("\n") + text_of(head, HEAD[1])
        assert pilot.app.query_one(Engine).shown == [view]
        kv, queue = (pilot.app.query_one(f"#pane-{key}", ChartPane) for key in ("kv", "queue"))
        assert looks(kv.border_title) == looks(text_of(kv, KV.legend))
        assert looks(kv.border_subtitle) == looks(text_of(kv, KV.latest))
        assert queue.render_line(0).text.rstrip() == "idle"
        for key in ("hit", "tps", "lat"):  # no pane of theirs: the engine's word for it
            pane = pilot.app.query_one(f"#pane-{key}", ChartPane)
            assert (pane.border_title, pane.render_line(0).text.rstrip()) == (None, "nothing")
        assert panes.has_class("-wide")
        charts = list(pilot.app.query(ChartPane))
        assert [c.id for c in charts if c.has_class("pane")] == [
            "pane-kv", "pane-queue", "pane-hit", "pane-tps", "pane-lat"]
        grid = [w.id for w in pilot.app.query_one("#panes-grid").children]
        assert grid == ["pane-queue", "pane-hit", "pane-tps", "pane-lat"]
        # beside the KV chart, in the order given
        top = [w.id for w in pilot.app.query_one("#panes-top").children]
        assert top == ["pane-kv", "beside", "gpu"]
        panes.show(EngineView("other", HEAD, [KV]))
        assert panes.border_title == "other"


async def test_a_chart_drawn_cell_by_cell_at_its_pane_s_size_in_its_roles_styles() -> None:
    async with PaneApp().run_test(size=(40, 12)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        pane.show(KV)
        await pilot.pause()
        width, height = pane.content_size
        rows = render(CHART, width, height)
        assert len(rows) == height
        for y, row in enumerate(rows):
            strip = pane.render_line(y)
            assert strip.cell_length == width
            assert cells(strip) == want_cells(pane, row, width), y
        assert cells(pane.render_line(height)) == [(" ", pane.rich_style)] * width
        await pilot.resize_terminal(30, 8)  # drawn again at the new size
        await pilot.pause()
        width, height = pane.content_size
        rows = render(CHART, width, height)
        assert [pane.render_line(y).text for y in range(height)] == [
            "".join(piece for piece, _ in row) for row in rows]


async def test_a_pane_too_small_for_its_chart_or_without_one_says_so_dimmed() -> None:
    async with PaneApp().run_test(size=(40, 12)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        pane.styles.width = 9  # 7 cells inside the border: no chart fits
        pane.show(KV)
        await pilot.pause()
        width = pane.content_size.width
        assert width == 7
        assert cells(pane.render_line(0)) == want_cells(pane, [("no data", "dim")], width)
        pane.show(None, "")  # nothing and nothing to say: blank
        await pilot.pause()
        assert cells(pane.render_line(0)) == [(" ", pane.rich_style)] * width
        assert (pane.border_title, pane.border_subtitle) == (None, None)
        pane.show(None, "gone")
        await pilot.pause()
        assert cells(pane.render_line(0)) == want_cells(pane, [("gone", "dim")], width)


async def test_only_what_changed_is_drawn_again() -> None:
    async with PaneApp().run_test(size=(40, 12)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        mounted = pane.refreshes
        pane.show(None)  # nothing shown yet and nothing to say: nothing to do
        pane.show(None, "")
        assert pane.refreshes == mounted
        assert pilot.app.query_one(CountingHead).has_class("-head")

        def show(view: PaneView | None, empty: str = "") -> int:
            pane.show(view, empty)
            pane.render_line(0)
            return pane.draws

        drawn = show(KV)
        title, refreshes = pane.border_title, pane.refreshes
        assert show(PaneView(**_fields(KV))) == drawn  # an equal view: nothing to do
        assert pane.refreshes == refreshes
        assert show(PaneView(**{**_fields(KV), "latest": [("81", "bad")]})) == drawn + 1
        assert pane.border_title is title  # the legend is the same: no new title
        assert looks(pane.border_subtitle) == looks(text_of(pane, [("81", "bad")]))
        subtitle = pane.border_subtitle
        assert show(PaneView(**{**_fields(KV), "legend": [("KV", "title")],
                                "latest": [("81", "bad")]})) == drawn + 2
        assert looks(pane.border_title) == looks(text_of(pane, [("KV", "title")]))
        assert pane.border_subtitle is subtitle
        assert show(None, "gone") == drawn + 3
        assert show(None, "gone") == drawn + 3
        assert show(None, "other") == drawn + 4
        assert show(QUEUE, "other") == drawn + 5
        looked_up = sorted(pane.looked_up)  # each once, each one kvtop.tcss styles
        assert looked_up == sorted(set(looked_up))
        assert {"pane--title", "pane--s1", "pane--bad", "pane--dim"} <= set(looked_up)
        assert set(looked_up) <= {f"pane--{role}" for role in ROLES}
        head = pilot.app.query_one(CountingHead)
        head.show(HEAD)
        head.show([list(line) for line in HEAD])
        assert head.updates == 1
        head.show(HEAD[:1])
        assert head.updates == 2


def _fields(view: PaneView) -> dict:
    return {"key": view.key, "legend": view.legend, "latest": view.latest,
            "chart": view.chart, "empty": view.empty}


async def test_a_new_theme_redraws_in_its_styles() -> None:
    async with PaneApp().run_test(size=(40, 12)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        pane.show(KV)
        await pilot.pause()
        old = pane.render_line(0)
        pilot.app.theme = "textual-light" if pilot.app.theme != "textual-light" else "nord"
        await pilot.pause()
        width, height = pane.content_size
        row = render(CHART, width, height)[0]
        assert cells(pane.render_line(0)) == want_cells(pane, row, width)
        assert cells(pane.render_line(0)) != cells(old)
        pane.show(PaneView(**{**_fields(KV), "latest": [("81", "bad")]}))
        assert looks(pane.border_subtitle) == looks(text_of(pane, [("81", "bad")]))


async def test_an_engine_without_a_name_has_an_empty_title() -> None:
    async with PanesApp().run_test(size=(100, 30)) as pilot:
        panes = pilot.app.query_one(EnginePanes)
        panes.show(EngineView(""))
        assert panes.border_title == ""
