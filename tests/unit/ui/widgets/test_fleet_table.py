"""The fleet table mounted in a small app with kvtop's stylesheet (Pilot), fed rows that real
trackers built from real scrapes: each cell's text in its column's width and its level's
colour, the header and its sort marker, the columns a terminal's width keeps, the cursor kept
on its row across refreshes and at both ends, group rows, keys and mouse, outside text drawn
as written, and only the lines that changed drawn again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.segment import Segment
from rich.style import Style
from textual.app import App, ComposeResult
from textual.geometry import Region, Size
from textual.strip import Strip

import kvtop.ui
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from kvtop.ui.fleet_trackers import FleetTrackers
from kvtop.ui.widgets.fleet_table import FleetTable, cell_text, column_at, fit, header_text
from kvtop.view.cells import Cell, Column
from kvtop.view.fleet import FleetRow, build_rows, filter_rows, order_rows
from kvtop.view.groups import group_rows
from tests.scenarios.app import (
    LEAKING_IDLE,
    LIVE_TARGETS,
    T0,
    UNDER_LOAD,
    live_scrapes,
    static_trackers,
)
from tests.support.paths import fixture_text

STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"
NOW = T0 + 2
LEVELS = ("ok", "warn", "bad", "alarm", "dim")
KEY_A, KEY_B = (f"{t.url}|twin-llama|0" for t in LIVE_TARGETS[:2])  # the two vLLM hosts
KEY_GW = LIVE_TARGETS[2].url
HEADER_100 = (" NAME             STATUS      KV BLOCKS       LEAK      RUN  WAIT LIMIT    HIT  "
              " GEN/s TTFT 50/99   ")


def rows_of(scrapes: list[Scrape]) -> list[FleetRow]:
    """The rows real trackers make of these scrapes, two seconds later."""
    fleet = FleetTrackers(TargetTracker, [s.target for s in scrapes], None)
    for scrape in scrapes:
        fleet.fold(read_scrape(scrape))
    return build_rows(fleet.states(), NOW)


def live_rows() -> list[FleetRow]:
    """Two vLLM hosts (one full and queueing, one idle) and an endpoint that isn't a server."""
    return rows_of(live_scrapes())


def many_rows(count: int, body: str = LEAKING_IDLE) -> list[FleetRow]:
    return rows_of([Scrape(Target.from_spec(f"10.1.0.{i}:8000"), T0, fixture_text(body))
                    for i in range(count)])


def named(*names: str) -> list[FleetRow]:
    return rows_of([Scrape(Target.from_spec(f"10.2.0.{i}:8000", name=name), T0,
                           fixture_text(LEAKING_IDLE)) for i, name in enumerate(names)])


class CountingTable(FleetTable):
    """Records the lines it is asked to repaint and the styles it looks up."""

    repainted: list[Region | str]
    looked_up: list[str]

    def refresh(self, *regions: Region, **kwargs: bool) -> CountingTable:
        # every repaint asked for (Textual's own too): a test empties the list before it looks
        self.repainted = [*getattr(self, "repainted", []),
                          *(regions or ["layout" if kwargs.get("layout") else "all"])]
        return super().refresh(*regions, **kwargs)

    def get_component_rich_style(self, *names: str, partial: bool = False) -> Style:
        self.looked_up = [*getattr(self, "looked_up", []), *names]
        return super().get_component_rich_style(*names, partial=partial)


class TableApp(App[None]):
    CSS_PATH = STYLESHEET

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[tuple[object, ...]] = []

        self.table = CountingTable(id="fleet")

    def compose(self) -> ComposeResult:
        yield self.table

    def _heard(self, kind: str, message: FleetTable.RowHighlighted, *more: object) -> None:
        assert message.control is self.table
        row = self.table.selected_row
        self.heard.append((kind, row.key if row else None, *more))

    def on_fleet_table_row_highlighted(self, message: FleetTable.RowHighlighted) -> None:
        self._heard("highlighted", message)

    def on_fleet_table_row_selected(self, message: FleetTable.RowSelected) -> None:
        self._heard("selected", message)

    def on_fleet_table_header_clicked(self, message: FleetTable.HeaderClicked) -> None:
        self._heard("header", message, message.column)

    def on_fleet_table_group_toggled(self, message: FleetTable.GroupToggled) -> None:
        self._heard("toggled", message, message.key, message.open)


def roles(table: FleetTable, strip: Strip) -> list[tuple[str, str]]:
    """Each piece of a drawn line and the role kvtop.tcss styles it as: "" plain, "cursor",
    a level's text colour over either, or "header"; anything else shows as its style."""
    base = table.rich_style
    cursor = table.get_component_rich_style("fleet--cursor")
    known = {base: "", base + cursor: "cursor",
             table.get_component_rich_style("fleet--header"): "header"}
    for level in LEVELS:
        full = table.get_component_rich_style(f"fleet--{level}")
        text_only = Style(color=full.color, bold=full.bold, reverse=full.reverse)
        known[base + text_only] = level
        known[base + cursor + text_only] = f"cursor {level}"
    return [(s.text, known.get(s.style, repr(s.style))) for s in strip]


def lines(table: FleetTable) -> list[str]:
    return [table.render_line(y).text for y in range(table.size.height)]


# -- the pieces, without a terminal ----------------------------------------------------------


def test_fit_pads_cuts_with_an_ellipsis_and_keeps_the_tail_it_is_asked_to() -> None:
    assert fit("abc", 5) == "abc  "
    assert fit("abcde", 5) == "abcde"  # exactly the width: not cut
    assert fit("abcdef", 5) == "abcd…"
    assert fit("llama-70b-prod-a e1", 10, keep=3) == "llama-… e1"
    # the tail survives while it leaves a cell beside the ellipsis: keep < width - 1
    assert fit("abcdefgh", 5, keep=3) == "a…fgh"
    assert fit("abcdefgh", 5, keep=4) == "abcd…"
    assert fit("abcdefgh", 5, keep=0) == "abcd…"
    assert fit("abcdefgh", 5, keep=1) == "abc…h"


def test_fit_counts_cells_not_characters() -> None:
    assert fit("東京", 4) == "東京"  # two characters, four cells: it fits exactly
    assert fit("東京", 5) == "東京 "
    assert fit("東京東京", 6) == "東京 …"  # a wide character never split: a space instead
    assert fit("prod 東京", 6, keep=2) == "p…東京"  # the wide tail takes its four cells


def test_header_marks_the_sorted_column_and_pads_as_the_cells() -> None:
    wide = [Column("name", "NAME", 6, 0), Column("gen", "GEN/s", 5, 2, pad=1)]
    assert header_text(wide, "", True) == " NAME    GEN/s"
    assert header_text(wide, "name", True) == " NAME▲   GEN/s"
    assert header_text(wide, "name", False) == " NAME▼   GEN/s"
    assert header_text(wide, "gen", True) == " NAME    GEN/▲"  # a full label gives way to ▲


def test_column_at_maps_a_cell_to_its_column_including_the_spaces_around_it() -> None:
    columns = [Column("name", "NAME", 6, 0), Column("gen", "GEN/s", 5, 2, pad=1)]
    assert [column_at(columns, x) for x in (-1, 0, 7, 8, 13, 14)] == [
        None, "name", "name", "gen", "gen", None]


def test_a_narrowed_column_shows_the_short_form_only_where_the_text_is_wider() -> None:
    kv = Cell("████▏ 828/1000", "warn", short="██▌ 828/1000")
    assert cell_text(kv, 14) == "████▏ 828/1000"
    assert cell_text(kv, 13) == "██▌ 828/1000 "
    assert cell_text(Cell("東京", short="T"), 3) == "T  "  # four cells: wider than three
    assert cell_text(Cell("東京", short="T"), 4) == "東京"
    assert cell_text(Cell("vllm e1", keep=3), 6) == "vl… e1"
    assert cell_text(Cell("abcdefg"), 6) == "abcde…"


# -- the table mounted in a small app ---------------------------------------------------------


async def test_each_cell_in_its_column_s_width_and_its_level_s_colour() -> None:
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(live_rows())
        await pilot.pause()
        assert table.has_focus and table.size.height == 4  # the header and its three rows
        assert roles(table, table.render_line(0)) == [(HEADER_100, "header")]
        assert roles(table, table.render_line(1)) == [
            (" 10.0.0.5:8000    ", "cursor"), ("up", "cursor ok"), ("          ", "cursor"),
            ("████▉ 588/599", "cursor bad"), ("   ", "cursor"), ("WARMUP", "cursor dim"),
            ("    30   ", "cursor"), ("149", "cursor warn"), ("  ", "cursor"),
            ("KV cap", "cursor warn"), ("   ", "cursor"), ("(38%)", "cursor dim"),
            (" –     –          ", "cursor"), ("  ", "")]
        assert roles(table, table.render_line(2)) == [
            (" 10.0.0.5:8001    ", ""), ("up", "ok"), ("          ", ""),
            ("████▏ 828/1000", "warn"), ("  ", ""), ("WARMUP", "dim"), ("    0    0    ", ""),
            ("none", "dim"), ("     ", ""), ("(20%)", "dim"), (" –     –          ", ""),
            ("  ", "")]
        assert roles(table, table.render_line(3)) == [
            (" gateway          ", ""), ("unknown", "warn"), ("     ", ""),
            ("not LLM server?", "warn"), (" ", ""), ("–", "dim"), ("         ", ""),
            ("–", "dim"), ("    ", ""), ("–", "dim"), ("    ", ""), ("–", "dim"),
            ("        ", ""), ("–", "dim"), ("     ", ""), ("–", "dim"), ("     ", ""),
            ("–", "dim"), ("          ", ""), ("  ", "")]
        assert roles(table, table.render_line(4)) == [(" " * 100, "")]  # below the rows


async def test_the_cursor_s_colours_follow_focus_and_a_leak_stays_red_on_it() -> None:
    trackers = static_trackers()
    rows = order_rows(build_rows([t.state for t in trackers.values()], T0 + 300), "worst")
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(rows)
        await pilot.pause()
        focused = roles(table, table.render_line(1))
        assert focused == [
            (" vllm-wedged      ", "cursor"), ("up", "cursor ok"), ("          ", "cursor"),
            ("█████ 8000/8000", "cursor bad"), (" ", "cursor"), ("STALL", "cursor alarm"),
            ("     0    ", "cursor"), ("33", "cursor warn"), ("   ", "cursor"),
            ("KV cap", "cursor warn"), ("   –     0     –          ", "cursor"), ("  ", "")]
        # a LEAK badge is its text alone: the column's spaces after it stay plain
        assert roles(table, table.render_line(2)) == [
            (" llama-70b-a      ", ""), ("up", "ok"), ("          ██░ 13.7k/20.2k ", ""),
            ("LEAK", "alarm"), ("      28   0    ", ""), ("none", "dim"),
            ("     61%   1089  99ms/1.0s  ", ""), ("  ", "")]
        focused_bg = table.get_component_rich_style("fleet--cursor").bgcolor
        table.blur()
        await pilot.pause()
        assert table.get_component_rich_style("fleet--cursor").bgcolor != focused_bg
        assert roles(table, table.render_line(1)) == focused  # drawn again in the new colours
        name = next(iter(table.render_line(1)))
        assert name.style is not None and name.style.bgcolor != focused_bg


async def test_the_columns_a_terminal_keeps_beside_the_scrollbar_s_cell() -> None:
    async with TableApp().run_test(size=(99, 12)) as pilot:
        table = pilot.app.table
        table.show(live_rows())
        await pilot.pause()
        ten = ["name", "status", "kv", "leak", "running", "waiting", "limit", "hit", "gen",
               "ttft"]
        assert [c.key for c in table.columns] == ten  # 98 cells and the scrollbar's one
        assert table.virtual_size == Size(98, 4)
        assert table.render_line(0).text == HEADER_100[:99]
        await pilot.resize_terminal(98, 12)
        await pilot.pause()
        assert [c.key for c in table.columns] == ten[:-1]  # TTFT needs the 98th cell
        assert table.virtual_size == Size(86, 4)
        assert table.render_line(0).text == HEADER_100[:86] + " " * 12
        assert table.render_line(1).text == (" 10.0.0.5:8000    up          ████▉ 588/599   "
                                             "WARMUP    30   149  KV cap   (38%) –" + " " * 16)
        await pilot.resize_terminal(151, 12)
        await pilot.pause()
        wide = ["name", "status", "kv", "leak", "running", "waiting", "limit", "preempt", "hit",
                "prompt", "gen", "ttft"]
        assert [c.key for c in table.columns] == wide
        assert not table.columns_with_gpu
        table.show_gpu_column(True)
        assert table.columns_with_gpu
        assert [c.key for c in table.columns] == [*wide[:3], "gpu", *wide[3:]]
        table.show_delta_column(True)  # both: the token rate in gives them room
        assert [c.key for c in table.columns] == [*wide[:3], "gpu", "leak", "delta",
                                                  *wide[4:9], *wide[10:]]
        await pilot.pause()
        assert table.render_line(0).text == (
            " NAME              STATUS       KV BLOCKS          GPU MEM    LEAK          Δ KV/TTFT"
            "    RUN   WAIT  LIMIT     PRE/s  HIT    GEN t/s  TTFT 50/99       ")
        table.show_gpu_column(False)
        assert not table.columns_with_gpu
        assert [c.key for c in table.columns] == [*wide[:4], "delta", *wide[4:]]
        table.show_delta_column(False)
        assert [c.key for c in table.columns] == wide
        await pilot.pause()
        # wide columns: a space either side of each cell
        assert table.render_line(1).text == (
            " 10.0.0.5:8000     up           ████▉ 588/599      WARMUP        30    149   KV cap"
            "    –      (38%)  –       –        –" + " " * 32)


async def test_a_narrow_terminal_keeps_the_verdict_columns_and_clicks_go_by_what_is_drawn(
) -> None:
    async with TableApp().run_test(size=(40, 12)) as pilot:
        table = pilot.app.table
        table.show(live_rows())
        await pilot.pause()
        assert [c.key for c in table.columns] == ["name", "status", "kv", "leak"]
        assert table.virtual_size == Size(55, 4)  # wider than the table: cut at its edge
        assert table.render_line(0).text == " NAME             STATUS      KV BLOCKS…"
        assert table.render_line(1).text == " 10.0.0.5:8000    up          ████▉ 588/"
        # even scrolled sideways (it never is: overflow-x is hidden), the lines are drawn
        # from their first cell, and a click goes to the column drawn where it lands
        table.scroll_to(x=10, animate=False, force=True)
        await pilot.pause()
        assert table.render_line(0).text == " NAME             STATUS      KV BLOCKS…"
        await pilot.click("#fleet", offset=(0, 0))
        await pilot.click("#fleet", offset=(17, 0))
        await pilot.click("#fleet", offset=(39, 0))
        assert pilot.app.heard == [("header", KEY_A, "name"), ("header", KEY_A, "status"),
                                   ("header", KEY_A, "kv")]


async def test_the_sort_marker_repaints_the_header_alone_and_only_when_it_changes() -> None:
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(live_rows())
        await pilot.pause()
        table.repainted = []
        table.show_sort("running", False)
        assert table.repainted == [Region(0, 0, 100, 1)]
        assert table.render_line(0).text == HEADER_100.replace("RUN ", "RUN▼")
        table.show_sort("running", False)
        assert table.repainted == [Region(0, 0, 100, 1)]  # the same sort: nothing to draw
        table.show_sort("running", True)
        assert table.render_line(0).text == HEADER_100.replace("RUN ", "RUN▲")
        table.show_sort("name", True)
        assert table.render_line(0).text == HEADER_100.replace("NAME ", "NAME▲")
        assert table.repainted == [Region(0, 0, 100, 1)] * 3


async def test_the_cursor_stays_on_its_row_through_new_scrapes_sorts_and_filters() -> None:
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        assert table.selected_row is None and table.rows == []
        table.show(live_rows())
        await pilot.press("down")
        assert table.selected_row is not None and table.selected_row.key == KEY_B
        rows = order_rows(live_rows(), "running")  # new rows from new scrapes, in a new order
        table.show(rows)
        assert [r.key for r in table.rows] == [KEY_A, KEY_B, KEY_GW]
        assert table.selected_row is rows[1]
        table.show(rows[::-1])
        assert table.selected_row is rows[1]
        table.show(filter_rows(rows, "gateway"))  # its row filtered out: the cursor stays put
        assert table.selected_row is not None and table.selected_row.key == KEY_GW
        table.show(rows[::-1])
        assert table.selected_row is rows[2]
        await pilot.press("down", "down")
        table.show(rows[1:])  # its row gone from the end: the last row
        assert table.selected_row is rows[2]
        table.show([])
        assert table.selected_row is None
        table.show(rows)
        assert table.selected_row is rows[0]
        assert pilot.app.heard == [("highlighted", KEY_B), ("highlighted", KEY_B),
                                   ("highlighted", KEY_A)]


async def test_keys_move_the_cursor_a_row_or_a_page_and_stop_at_both_ends() -> None:
    rows = many_rows(30)
    keys = [r.key for r in rows]
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(rows)
        await pilot.pause()
        assert table.size.height == 7  # 60 % of the screen: the header and six rows
        await pilot.press("up", "home")  # already on the first row: nothing happens
        assert pilot.app.heard == []
        await pilot.press("down", "j", "down", "k")
        assert table.selected_row is rows[2]
        await pilot.press("pagedown")
        assert table.selected_row is rows[8] and table.scroll_y == 3  # the cursor in view
        await pilot.press("pageup")
        assert table.selected_row is rows[2] and table.scroll_y == 2
        await pilot.press("end")
        assert table.selected_row is rows[29] and table.scroll_y == 24
        await pilot.press("down", "end", "pagedown")  # the last row: nowhere to go
        await pilot.press("up")
        assert table.selected_row is rows[28] and table.scroll_y == 24
        await pilot.press("home")
        assert table.selected_row is rows[0] and table.scroll_y == 0
        await pilot.press("pageup")
        assert pilot.app.heard == [("highlighted", keys[i]) for i in (1, 2, 3, 2, 8, 2, 29, 28,
                                                                       0)]


async def test_a_move_repaints_the_two_lines_it_changes() -> None:
    rows = many_rows(30)
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(rows)
        await pilot.pause()
        table.repainted = []
        table.action_cursor(1)
        assert table.repainted == [Region(0, 1, 100, 1), Region(0, 2, 100, 1)]
        table.action_cursor_to(10)  # scrolled five rows on: row 10 is the sixth line
        assert table.scroll_y == 5
        assert table.repainted[-2:] == [Region(0, -3, 100, 1), Region(0, 6, 100, 1)]
        assert [line[:14] for line in lines(table)[1:]] == [
            f" 10.1.0.{i}:8000"[:14] for i in range(5, 11)]
        assert roles(table, table.render_line(6))[0] == (" 10.1.0.10:8000   ", "cursor")


async def test_enter_and_the_arrows_open_and_close_a_group_or_select_a_row() -> None:
    rows = group_rows(live_rows(), "model", set(), "name")
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(rows)
        await pilot.pause()
        assert [r.key for r in table.rows] == ["group:model:(none)", KEY_GW,
                                               "group:model:twin-llama", KEY_A, KEY_B]
        assert lines(table)[1].startswith(" ▾ (none) (1)     1/1 up ")
        await pilot.press("enter", "left", "right")
        await pilot.press("down", "enter", "left", "right")
        assert pilot.app.heard == [
            ("toggled", "group:model:(none)", "group:model:(none)", None),
            ("toggled", "group:model:(none)", "group:model:(none)", False),
            ("toggled", "group:model:(none)", "group:model:(none)", True),
            ("highlighted", KEY_GW), ("selected", KEY_GW)]  # a server's row: no group to toggle


async def test_clicks_sort_by_a_header_move_to_a_row_select_it_and_toggle_its_group() -> None:
    rows = group_rows(live_rows(), "model", set(), "name")
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(rows)
        await pilot.pause()
        # the header: the first column and the spaces after it; nothing right of the last
        for x in (0, 16, 17, 97, 98):  # narrowed: one space after each
            await pilot.click("#fleet", offset=(x, 0))
        await pilot.click("#fleet", offset=(3, 3))  # a group's name, not its marker: moves
        await pilot.click("#fleet", offset=(3, 3))  # the cursor's row: selected
        await pilot.click("#fleet", offset=(2, 1))  # the other group's marker: toggled
        await pilot.click("#fleet", offset=(20, 2))  # a server's row, then again
        await pilot.click("#fleet", offset=(20, 2))
        await pilot.click("#fleet", offset=(2, 4))  # a server's row, where a marker would be
        await pilot.click("#fleet", offset=(20, 6))  # below the rows: nothing
        twin, none = "group:model:twin-llama", "group:model:(none)"
        assert pilot.app.heard == [
            ("header", none, "name"), ("header", none, "name"), ("header", none, "status"),
            ("header", none, "ttft"),
            ("highlighted", twin), ("toggled", twin, twin, None),
            ("highlighted", none), ("toggled", none, none, None),
            ("highlighted", KEY_GW), ("selected", KEY_GW), ("highlighted", KEY_A)]


async def test_new_numbers_repaint_only_the_lines_whose_cells_changed() -> None:
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        first = live_rows()
        table.show(first)
        await pilot.pause()
        drawn = [table.render_line(y) for y in range(4)]
        table.repainted = []
        again = live_rows()  # the same scrapes again: equal cells, nothing to draw
        table.show(again)
        assert table.repainted == []
        assert [table.render_line(y) for y in range(4)] == drawn
        assert all(table.render_line(y) is drawn[y] for y in range(1, 4))  # kept, not redrawn
        busier = rows_of([Scrape(LIVE_TARGETS[0], T0, fixture_text(UNDER_LOAD)),
                          Scrape(LIVE_TARGETS[1], T0, fixture_text(UNDER_LOAD)),
                          live_scrapes()[2]])
        table.show(busier)  # the second host under load now: its line alone
        assert table.repainted == [Region(0, 2, 100, 1)]
        assert table.render_line(2).text.startswith(" 10.0.0.5:8001    up          ████▉ 588/599")
        table.repainted = []
        table.show(busier[:2])  # the gateway gone: its line blank
        # the new virtual size asks for a layout, and the table asks again: it shrinks
        assert table.repainted == ["layout", "layout", Region(0, 3, 100, 1)]
        table.repainted = []
        table.show(busier[::-1][1:])  # other rows on both lines
        assert table.repainted == [Region(0, 1, 100, 1), Region(0, 2, 100, 1)]
        table.repainted = []
        table.show(busier[::-1])  # a row more: the table grows, and every line is new
        assert table.repainted == ["layout", "layout", Region(0, 1, 100, 1),
                                   Region(0, 2, 100, 1), Region(0, 3, 100, 1)]


async def test_a_table_scrolled_with_the_wheel_stays_where_it_was_put() -> None:
    rows = many_rows(30)
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(rows)
        await pilot.pause()
        table.scroll_to(y=10, animate=False, force=True)
        await pilot.pause()
        table.show(many_rows(30, UNDER_LOAD))
        assert table.scroll_y == 10 and table.selected_row is not None
        assert table.selected_row.key == rows[0].key
        table.scroll_to(y=0, animate=False, force=True)
        await pilot.press("end")
        assert table.scroll_y == 24  # the cursor's row last on the screen
        more = many_rows(31)
        table.show(more[30:] + more[:30])  # a row more above it: the view follows the cursor
        assert table.selected_row is more[29] and table.scroll_y == 25
        table.scroll_to(y=3, animate=False, force=True)
        await pilot.press("home")  # above the screen: the view comes back to it
        assert table.scroll_y == 0


async def test_outside_text_is_drawn_as_written_and_cut_in_cells() -> None:
    rows = named("[b]x[/b] [red]", "東京-llama-70b-prod-server", "llama-70b-prod-a")
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(rows)
        await pilot.pause()
        assert [line[:18] for line in lines(table)[1:4]] == [  # 18 cells, 17 characters
            " [b]x[/b] [red]   ", " 東京-llama-70b-… up", " llama-70b-prod-a "]


async def test_each_style_is_looked_up_once_until_the_styles_change() -> None:
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(live_rows())
        await pilot.pause()
        table.looked_up = []
        table._forget_rendering()
        lines(table)
        lines(table)
        assert sorted(table.looked_up) == ["fleet--bad", "fleet--cursor", "fleet--dim",
                                           "fleet--header", "fleet--ok", "fleet--warn"]


async def test_the_cache_of_drawn_lines_starts_afresh_past_its_bound() -> None:
    row = live_rows()[1]
    rows = [replace(row, key=f"{row.key}#{i}") for i in range(1025)]  # it keeps 1024
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        for shown in (rows[:-1], rows):  # as many lines as it keeps, then one more
            table.show(shown)
            await pilot.pause()
            first = table.render_line(1)
            for top in range(0, len(shown), 6):
                table.scroll_to(y=top, animate=False, force=True)
                lines(table)
            table.scroll_to(y=0, animate=False, force=True)
            table.show(shown)
            assert table.render_line(1) == first
            assert (table.render_line(1) is first) == (len(shown) == 1024)


def test_a_table_without_its_stylesheet_draws_unstyled_and_keeps_its_columns() -> None:
    """Not mounted yet, or its app tearing down: no component styles to look up."""
    table = FleetTable(id="fleet", classes="-wide")
    assert table.classes == frozenset({"-wide"})
    table.show_gpu_column(False)  # as they are: nothing to fit
    table.show_delta_column(False)
    assert table.columns == [] and table.columns_with_gpu is False
    assert list(table.render_line(0)) == [Segment("", Style.null())]


async def test_an_unchanged_sort_or_width_draws_nothing_again() -> None:
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(live_rows())
        await pilot.pause()
        lines(table)
        table.repainted, table.looked_up = [], []
        table.show_sort("", False)  # unsorted, as it starts
        await pilot.resize_terminal(101, 12)  # a cell wider: the same columns
        await pilot.pause()
        assert [line[:20] for line in lines(table)] == [
            " NAME             ST", " 10.0.0.5:8000    up", " 10.0.0.5:8001    up",
            " gateway          un"]
        assert table.render_line(0).text == HEADER_100 + " "  # the header drawn a cell wider
        assert table.render_line(0) is table.render_line(0)  # and kept while it is that wide
        assert Region(0, 0, 100, 1) not in table.repainted and "layout" not in table.repainted
        assert table.looked_up == []  # the styles it had: not looked up again


async def test_an_empty_table_has_no_cursor_to_move_or_select() -> None:
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show([])
        await pilot.press("down", "end", "pagedown", "enter", "right")
        assert pilot.app.heard == [] and table.selected_row is None
        assert lines(table) == [HEADER_100]


async def test_the_view_follows_the_cursor_only_from_on_the_screen() -> None:
    rows = many_rows(30)
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(rows)
        await pilot.pause()
        # on the top line: followed down when the row moves off the bottom
        table.show(rows[1:11] + rows[:1] + rows[11:])
        assert table.scroll_y == 5 and table.selected_row is rows[0]
        table.show(rows)
        assert table.scroll_y == 0  # and back up, at once (no animation)
        await pilot.press(*["down"] * 6)
        table.scroll_to(y=0, animate=False, force=True)  # the cursor just below the screen
        await pilot.pause()
        table.show(rows)
        assert table.scroll_y == 0


async def test_the_view_follows_even_before_the_table_grows_to_its_new_rows() -> None:
    rows = many_rows(30)
    async with TableApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(rows[:3])
        await pilot.pause()
        await pilot.press("down", "down")
        assert table.size.height == 4 and not table.allow_vertical_scroll  # no scrollbar yet
        table.show(rows[3:20] + rows[:3] + rows[20:])  # its row 19th of 30: scrolled to it
        assert table.scroll_y == 17
        table.show(rows[2:3] + rows[:2] + rows[3:])  # its row first again: back to the top
        assert table.scroll_y == 0
        table.show(rows[3:20] + rows[:3] + rows[20:])
        await pilot.pause()
        assert table.size.height == 7 and table.scroll_y == 17  # rows 17-22 on the screen
        assert lines(table)[3].startswith(" 10.1.0.2:8000")


class TallApp(TableApp):
    """The table taller than its rows (a stylesheet of its own), so a click lands below them."""

    CSS = "#fleet { height: 8; max-height: 8; }"


async def test_a_click_below_the_rows_does_nothing() -> None:
    async with TallApp().run_test(size=(100, 12)) as pilot:
        table = pilot.app.table
        table.show(live_rows())
        await pilot.pause()
        for y in (4, 5):  # the first line after the last row, and the next
            await pilot.click("#fleet", offset=(20, y))
        await pilot.click("#fleet", offset=(20, 3))
        assert pilot.app.heard == [("highlighted", KEY_GW)]
