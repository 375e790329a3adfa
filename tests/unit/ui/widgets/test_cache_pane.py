"""The cache pane mounted in a small app with kvtop's stylesheet (Pilot): the lines it is given,
each piece in its role's style, never read as markup, drawn again only when they change or
the theme does."""

from __future__ import annotations

from pathlib import Path

from rich.text import Span, Text
from textual.app import App, ComposeResult

import kvtop.ui
from kvtop.ui.widgets.cache_pane import CachePane
from kvtop.view.engine import EngineView, Line

STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"
LIMIT: Line = [("limit  ", "key"), ("KV capacity", "warn")]
EVIDENCE: Line = [("EVIDENCE ", "alarm"), ("[bold]7[/bold] held", "")]


class CountingPane(CachePane):
    """Counts its updates (a redraw of unchanged lines costs the app a layout)."""

    updates = 0

    def update(self, *args: object, **kwargs: object) -> None:
        self.updates += 1
        super().update(*args, **kwargs)  # type: ignore[arg-type]


class PaneApp(App[None]):
    CSS_PATH = STYLESHEET

    def compose(self) -> ComposeResult:
        yield CountingPane(id="cache")


def styled(pane: CachePane, *pieces: tuple[str, str]) -> Text:
    """What the pane should show: each piece in the style its role has in kvtop.tcss."""
    text = Text()
    for piece, role in pieces:
        text.append(piece, pane.get_component_rich_style(f"pane--{role}") if role else None)
    return text


def spans(text: Text) -> list[Span]:
    return [span for span in text.spans if span.style]


async def test_each_line_in_its_roles_styles_and_markup_shown_as_written() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        assert pane.border_title == "KV cache"
        pane.show([LIMIT, EVIDENCE])
        await pilot.pause()
        shown = pane.content
        assert isinstance(shown, Text)
        assert shown.plain == "limit  KV capacity\nEVIDENCE [bold]7[/bold] held"
        expected = Text("\n").join([styled(pane, *LIMIT), styled(pane, *EVIDENCE)])
        assert spans(shown) == spans(expected)
        assert spans(shown)[1] == Span(7, 18, pane.get_component_rich_style("pane--warn"))
        assert str(pane.render()) == "limit  KV capacity\nEVIDENCE [bold]7[/bold] held"


async def test_a_line_wider_than_the_pane_is_cut_never_wrapped() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        width = pane.content_size.width
        pane.show([[("x" * (width + 5), "")], [("y" * width, "")]])
        await pilot.pause()
        rows = [pane.render_line(y).text for y in range(4)]
        assert rows[:2] == ["x" * (width - 1) + "…", "y" * width]


async def test_the_engine_view_draws_its_cache_lines_and_none_draw_an_empty_pane() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        pane.show_engine(EngineView("h:1", lines=[[("other", "")]], cache=[LIMIT]))
        assert pane.content.plain == "limit  KV capacity"
        pane.show_engine(EngineView("h:1", cache=[]))
        assert pane.content.plain == ""


async def test_unchanged_lines_are_not_drawn_again_until_the_theme_changes() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        pane.show([LIMIT])
        pane.show([LIMIT])
        assert pane.updates == 1
        pane.show([EVIDENCE])
        assert pane.updates == 2
        warn = pane.get_component_rich_style("pane--warn")
        pilot.app.theme = "textual-light"
        await pilot.pause()
        assert pane.get_component_rich_style("pane--warn") != warn
        pane.show([LIMIT])
        assert spans(pane.content) == spans(styled(pane, *LIMIT))
        pane.show([LIMIT])
        assert pane.updates == 3
