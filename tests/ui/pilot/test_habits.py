"""htop's habits in the app (wheel, header clicks, F-keys, escape, groups, the help on one
screen, state colours on the selected row) and honest states over real HTTP servers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.containers import VerticalScroll
from textual.events import MouseScrollDown
from textual.geometry import Region
from textual.widgets import OptionList

from kvtop.collect.target import Scrape, Target
from kvtop.ui.app import AppConfig, KvtopApp
from kvtop.ui.screens.help import KEYS, HelpScreen, help_text
from kvtop.ui.screens.sort_menu import SortMenu
from kvtop.ui.widgets.fleet_table import FleetTable
from kvtop.view.groups import GroupRow
from tests.fakes.fake_source import FakeSource
from tests.fakes.faultserver import FaultServer, closed_port
from tests.scenarios.app import (
    HOST_A,
    HOST_B,
    LEAKING_IDLE,
    T0,
    UNDER_LOAD,
    live_app,
    live_data_shown,
    static_app,
    table_rows,
    until,
)
from tests.support.paths import fixture_text

WIDE = (200, 40)


def _names(app: KvtopApp) -> list[str]:
    return [row["name"] for row in table_rows(app)]


def _summary(app: KvtopApp) -> str:
    return str(app.query_one("#summary").render())


def _header(app: KvtopApp) -> str:
    return app.table.render_line(0).text


def _big_fleet(tmp_path: Path, count: int = 40) -> tuple[KvtopApp, FakeSource, list[Target]]:
    targets = [Target.from_spec(f"10.1.0.{i}:8000") for i in range(count)]
    source = FakeSource([Scrape(t, T0, fixture_text(LEAKING_IDLE)) for t in targets])
    app = KvtopApp(AppConfig(targets=targets, source_factory=lambda _: source, no_gpu=True,
                             clock=lambda: T0 + 2, snapshot_dir=tmp_path))
    return app, source, targets


def _drawn_after(app: KvtopApp, source: FakeSource, delivered: int) -> Callable[[], bool]:
    """True once ``delivered`` scrapes are in and a draw came after the call."""
    before = app.draw_clock.last_draw
    return lambda: len(source.delivered) == delivered and app.draw_clock.last_draw != before


async def test_the_wheel_s_scroll_survives_three_refreshes(tmp_path: Path) -> None:
    app, source, targets = _big_fleet(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        assert await until(pilot, lambda: len(source.delivered) == len(targets)
                           and "…" not in {r["status"] for r in table_rows(app)})
        for _ in range(6):
            await pilot._post_mouse_events([MouseScrollDown], "#fleet", offset=(10, 5))
        assert await until(pilot, lambda: app.table.scroll_y >= 6)
        scrolled = app.table.scroll_y
        assert app.table.selected_row is app.table.rows[0]  # the cursor stayed on top
        for second in (3, 4, 5):  # three refreshes, each with new numbers for every row
            source.push(*(Scrape(t, T0 + second, fixture_text(UNDER_LOAD)) for t in targets))
            assert await until(pilot, _drawn_after(app, source, len(targets) * (second - 1)))
            assert app.table.scroll_y == scrolled  # not snapped back to the cursor
        await pilot.press("down")  # the keyboard brings the cursor's row back into view
        assert app.table.scroll_y <= 1


async def test_clicking_a_header_sorts_by_it_and_again_reverses(tmp_path: Path) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        x = 0
        for column in app.table.columns:
            if column.key == "running":
                break
            x += column.width + column.pad
        await pilot.click("#fleet", offset=(x + 2, 0))
        # HOST_A runs 30, HOST_B none; the gateway has no number: last either way
        assert await until(pilot, lambda: _names(app) == ["10.0.0.5:8000", "10.0.0.5:8001",
                                                          "gateway"])
        assert "RUN▼" in _header(app) and "running ▼" in _summary(app)
        await pilot.click("#fleet", offset=(x + 2, 0))
        assert await until(pilot, lambda: _names(app) == ["10.0.0.5:8001", "10.0.0.5:8000",
                                                          "gateway"])
        assert "RUN▲" in _header(app) and "NAME" in _header(app) and "running ▲" in _summary(app)


async def test_f6_picks_a_sort_and_f3_searches(tmp_path: Path) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        await pilot.press("f6")
        assert await until(pilot, lambda: isinstance(app.screen, SortMenu))
        await pilot.press("down", "down", "down", "enter")  # name, model, worst, KV use
        assert await until(pilot, lambda: "sort KV use ▼" in _summary(app))
        assert "KV BLOCKS▼" in _header(app)
        # the menu marks the sort as the column and the header do: ▼ biggest first
        await pilot.press("f6")
        assert await until(pilot, lambda: isinstance(app.screen, SortMenu))
        menu = app.screen.query_one(OptionList)
        marked = [str(menu.get_option_at_index(i).prompt) for i in range(menu.option_count)]
        assert [m for m in marked if m.endswith(("▲", "▼"))] == ["KV use ▼"]
        await pilot.press("enter")  # the same again: the other way round, everywhere
        assert await until(pilot, lambda: "sort KV use ▲" in _summary(app))
        assert "KV BLOCKS▲" in _header(app)
        await pilot.press("f3", *"8001")
        assert await until(pilot, lambda: _names(app) == ["10.0.0.5:8001"])


async def test_a_search_leaves_the_header_the_fleet_s_and_says_what_it_shows(
        tmp_path: Path) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        assert "hosts 2/3 up" in _summary(app)
        await pilot.press("slash", *"8001", "enter")  # confirmed: the box is gone
        assert await until(pilot, lambda: _names(app) == ["10.0.0.5:8001"])
        assert not app.filter_box.display
        summary = _summary(app)
        # htop keeps its header system-wide: the fleet's hosts and pool (599 + 1000 blocks),
        # and what the search shows
        assert "hosts 2/3 up" in summary and "/1599 blocks" in summary
        assert "filter '8001' 1 of 3 shown" in summary
        await pilot.press("escape", "slash", *"nothing-matches", "enter")
        assert await until(pilot, lambda: _names(app) == [])
        assert "hosts 2/3 up" in _summary(app) and "0 of 3 shown" in _summary(app)
        assert await until(pilot, lambda: "no row matches 'nothing-matches'" in str(
            app.panes.head.render()))
        assert "no numbers" not in app.export_screenshot()
        await pilot.press("escape")
        assert await until(pilot, lambda: len(_names(app)) == 3)
        assert "hosts 2/3 up" in _summary(app) and "filter" not in _summary(app)


async def test_groups_aggregate_and_fold_like_htop_s_tree(tmp_path: Path) -> None:
    app = static_app()
    async with app.run_test(size=(160, 48)) as pilot:
        assert await until(pilot, lambda: len(app.table.rows) == 7)
        await pilot.press("f5", "f5")  # off -> config group -> model
        assert await until(pilot, lambda: "groups model" in _summary(app))
        rows = app.table.rows
        llama = next(r for r in rows if isinstance(r, GroupRow) and "Llama-3.3-70B" in r.name)
        members = llama.members
        assert len(members) == 2
        cells = llama.cells
        used = sum(m.stats.blocks_used for m in members)
        assert cells["kv"].text.endswith(f" {used / 1000:.1f}k/40.4k")  # blocks summed
        assert cells["running"].text == str(sum(int(m.stats.running) for m in members))
        assert cells["leak"].text.startswith("LEAK")  # the worst of its members
        assert cells["status"].text == "2/2 up"
        app.table.action_cursor_to(rows.index(llama))
        await pilot.press("left")  # fold
        assert await until(pilot, lambda: len(app.table.rows) == len(rows) - 2)
        assert app.table.rows[app.table._cursor].name.startswith("▸")
        await pilot.press("enter")  # unfold
        assert await until(pilot, lambda: len(app.table.rows) == len(rows))


async def test_the_help_fits_80x24_and_explains_every_state(tmp_path: Path) -> None:
    """Its box fits 80x24, no line is cut at the right, and what is below the box is
    reached by scrolling it (End): every line can be read."""
    app, _ = live_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f1")
        assert await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        box = app.screen.query_one("#help-box", VerticalScroll)
        body = app.screen.query_one("#help-body")
        await pilot.pause(0.1)
        lines = help_text(KEYS).plain.splitlines()
        assert len(lines) <= body.content_size.height  # the body holds every line
        assert max(len(line) for line in lines) <= body.content_size.width  # none cut
        assert box.region == Region(0, 0, 80, 24) and body.region.right <= 80 - 3
        await pilot.press("end")
        assert await until(pilot, lambda: box.scroll_offset.y == box.max_scroll_y > 0)
        assert box.scroll_offset.y + box.scrollable_content_region.height == len(lines)
        text = help_text(KEYS).plain
        for word in ("not found", "bad data", "timeout", "restarted", "unknown", "████▉",
                     "PRE/s", "lifetime", "window", "p50/p99", "estimated", "WATCH", "LEAK",
                     "STALL", "SATURATED", "F10", "F5", "F6", "F3"):
            assert word in text, word
        await pilot.press("escape")
        assert await until(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_the_selected_row_keeps_its_state_colours() -> None:
    app = static_app()
    async with app.run_test(size=(160, 48)) as pilot:
        assert await until(pilot, lambda: len(app.table.rows) == 7)
        table = app.query_one(FleetTable)
        index = next(i for i, r in enumerate(table.rows) if r.name == "llama-70b-a")
        table.action_cursor_to(index)
        await pilot.pause(0.1)
        strip = table.render_line(index + 1 - round(table.scroll_y))
        leak = next(s for s in strip if s.text.startswith("LEAK"))
        alarm = table.get_component_rich_style("fleet--alarm")
        assert leak.style is not None and leak.style.reverse and leak.style.color == alarm.color
        cursor = table.get_component_rich_style("fleet--cursor")
        name = next(s for s in strip if "llama-70b-a" in s.text)
        assert name.style is not None and name.style.bgcolor == cursor.bgcolor  # it is selected


@pytest.mark.parametrize("key", ["ctrl+c", "f10"])
async def test_ctrl_c_and_f10_quit_at_once(tmp_path: Path, key: str) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.press("slash")  # even while typing a search
        await pilot.press(key)
        assert await until(pilot, lambda: not app.is_running)


# -- honest states over real HTTP --------------------------------------------------------


def _panes_head(app: KvtopApp) -> str:
    return str(app.panes.head.render())


async def test_a_server_that_stops_answering_is_dimmed_at_the_first_failed_scrape(
        tmp_path: Path) -> None:
    async with FaultServer() as server:
        target = Target.from_spec(server.url(), name="vllm-a")
        app = KvtopApp(AppConfig(targets=[target], interval_s=0.5, no_gpu=True,
                                 snapshot_dir=tmp_path))
        async with app.run_test(size=WIDE) as pilot:
            assert await until(pilot, lambda: table_rows(app)
                               and table_rows(app)[0]["status"] == "up")
            live = app.table.rows[0].cells
            server.mode = "error500"
            failed = len(server.requests)
            # the next scrape fails: said at once, not after the tracker's minute of "stale"
            assert await until(pilot, lambda: table_rows(app)[0]["status"].startswith("down"))
            assert len(server.requests) <= failed + 4  # within about one interval
            row = app.table.rows[0]
            assert row.cells["kv"].text == live["kv"].text  # the last good numbers...
            assert row.cells["kv"].level == "dim"  # ...dimmed
            assert await until(pilot, lambda: "last good" in _panes_head(app))
            assert app.panes.query_one("#pane-kv").render().plain.strip() != "no data yet"


async def test_404_reads_not_found_and_never_answered_says_never(tmp_path: Path) -> None:
    async with FaultServer(mode="notfound") as server:
        missing = Target.from_spec(server.url(), name="missing")
        refused = Target.from_spec(f"127.0.0.1:{closed_port()}", name="refused")
        app = KvtopApp(AppConfig(targets=[missing, refused], interval_s=0.5, no_gpu=True,
                                 snapshot_dir=tmp_path))
        async with app.run_test(size=WIDE) as pilot:
            def statuses() -> dict[str, str]:
                return {r["name"]: r["status"] for r in table_rows(app)}

            assert await until(pilot, lambda: statuses() == {"missing": "not found",
                                                             "refused": "down"}), statuses()
            assert "hosts 0/2 up" in _summary(app)
            app.table.action_cursor_to(_names(app).index("missing"))
            assert await until(pilot, lambda: "last good never" in _panes_head(app))
            assert "HTTP 404" in _panes_head(app)


async def test_a_host_answering_again_is_live_again(tmp_path: Path) -> None:
    app, source = live_app(tmp_path, clock_at=T0 + 3)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        source.push(Scrape(HOST_B, T0 + 1, failure="timeout", error="timed out after 2s"))
        assert await until(pilot, lambda: dict((r["name"], r["status"])
                                               for r in table_rows(app))["10.0.0.5:8001"]
                           == "timeout 3s")
        source.push(Scrape(HOST_B, T0 + 2, fixture_text(LEAKING_IDLE)),
                    Scrape(HOST_A, T0 + 2, fixture_text(UNDER_LOAD)))
        assert await until(pilot, lambda: {r.name: r.cells["kv"].level
                                           for r in app.table.rows}["10.0.0.5:8001"] != "dim")
        assert HOST_A.url in app.trackers
