"""The GPU pane mounted in a small app with kvtop's stylesheet (Pilot): the lines it is given
for its width (two cells fewer than its content, drawn again at each resize), each piece in
its role's style, never read as markup, cut at the pane's edge, drawn again only when they
change."""

from __future__ import annotations

from pathlib import Path

from rich.style import Style
from rich.text import Span, Text
from textual.app import App, ComposeResult

import kvtop.ui
from kvtop.ui.widgets.gpu_pane import GpuPane
from kvtop.view.gpus import Line

STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"
TITLE: Line = [("GPU 0 ", "title"), ("H100 [b]x[/b]", "")]
MEMORY: Line = [("mem ", "dim"), ("74.0/80.0 GiB", "bad"), (" vLLM", "vllm")]


class CountingPane(GpuPane):
    """Counts its updates (GPU reads mostly repeat: an unchanged one must not redraw)."""

    updates = 0
    looked_up: list[str]

    def update(self, *args: object, **kwargs: object) -> None:
        self.updates += 1
        super().update(*args, **kwargs)  # type: ignore[arg-type]

    def get_component_rich_style(self, *names: str, partial: bool = False) -> Style:
        self.looked_up = [*getattr(self, "looked_up", []), *names]
        return super().get_component_rich_style(*names, partial=partial)


class PaneApp(App[None]):
    CSS_PATH = STYLESHEET

    def compose(self) -> ComposeResult:
        yield CountingPane(id="gpu")


class LinesAt:
    """The lines for a history ``cells`` wide; remembers each width asked."""

    def __init__(self, *lines: Line) -> None:
        self.lines = list(lines)
        self.widths: list[int] = []

    def __call__(self, cells: int) -> list[Line]:
        self.widths.append(cells)
        return self.lines


def spans(pane: GpuPane, *pieces: tuple[str, str]) -> list[Span]:
    """Where each styled piece should sit, in its role's style in kvtop.tcss."""
    out, start = [], 0
    for piece, role in pieces:
        if role:
            out.append(Span(start, start + len(piece),
                            pane.get_component_rich_style(f"gpu--{role}")))
        start += len(piece)
    return out


async def test_each_line_in_its_roles_styles_and_markup_shown_as_written() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        pane.show(LinesAt(TITLE, MEMORY))
        shown = pane.content
        assert isinstance(shown, Text)
        assert shown.plain == "GPU 0 H100 [b]x[/b]\nmem 74.0/80.0 GiB vLLM"
        assert shown.spans == spans(pane, *TITLE, ("\n", ""), *MEMORY)
        assert (shown.no_wrap, shown.overflow) == (True, "ellipsis")
        await pilot.pause()
        assert str(pane.render()) == "GPU 0 H100 [b]x[/b]\nmem 74.0/80.0 GiB vLLM"


async def test_each_role_s_style_is_looked_up_once_a_draw_and_a_plain_piece_s_never() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        pane.looked_up = []
        pane.show(LinesAt([("a", "dim"), ("b", ""), ("c", "dim")], [("d", ""), ("e", "bad")]))
        assert pane.looked_up == ["gpu--dim", "gpu--bad"]
        assert pane.content.spans == [Span(0, 1, pane.get_component_rich_style("gpu--dim")),
                                      Span(2, 3, pane.get_component_rich_style("gpu--dim")),
                                      Span(5, 6, pane.get_component_rich_style("gpu--bad"))]


async def test_a_role_without_a_style_and_no_lines_draw_plain_text() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        pane.show(LinesAt([("host", "nosuchrole"), (" 1", "")]))
        assert pane.content.plain == "host 1" and pane.content.spans == []
        pane.show(LinesAt())
        assert pane.content.plain == ""


async def test_the_history_is_two_cells_narrower_than_the_pane_at_every_size() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        await pilot.resize_terminal(70, 10)  # nothing to draw yet: nothing drawn
        await pilot.pause()
        assert pane.updates == 0
        lines_at = LinesAt(TITLE)
        pane.show(lines_at)
        assert lines_at.widths == [pane.content_size.width - 2]
        await pilot.resize_terminal(50, 10)
        await pilot.pause()
        assert lines_at.widths[-1] == pane.content_size.width - 2
        assert len(set(lines_at.widths)) == 2


async def test_a_line_wider_than_the_pane_is_cut_never_wrapped() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        width = pane.content_size.width
        pane.show(LinesAt([("x" * (width + 5), "")], [("y" * width, "")]))
        await pilot.pause()
        rows = [pane.render_line(y).text for y in range(3)]
        assert rows[:2] == ["x" * (width - 1) + "…", "y" * width]


async def test_unchanged_lines_are_not_drawn_again() -> None:
    async with PaneApp().run_test(size=(60, 10)) as pilot:
        pane = pilot.app.query_one(CountingPane)
        pane.show(LinesAt(TITLE))
        pane.show(LinesAt(TITLE))
        assert pane.updates == 1
        pane.show(LinesAt(MEMORY))
        assert pane.updates == 2
