"""The message line: the newest live message with its title, never read as markup, and how
many more are live; mounted in a small app wired as kvtop's (Pilot), it takes the footer's
line while a message is live, styled by its severity, and gives it back when the first
message expires."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.text import Span
from textual.app import App, ComposeResult
from textual.notifications import Notification
from textual.screen import Screen
from textual.widgets import Footer

import kvtop.ui
from kvtop.ui.widgets.message_line import MessageLine, message_text, show_messages

STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"


def test_the_newest_message_with_its_title_and_how_many_more() -> None:
    assert message_text([]) is None
    first = Notification("polling every 2s", "", "information", 2)
    leak = Notification("leaky: 828 blocks held [/bold]", "KV LEAK", "error", 30)
    assert message_text([first]).plain == "polling every 2s"
    text = message_text([first, leak])
    assert text.plain == "KV LEAK: leaky: 828 blocks held [/bold]  (+1 more)"  # not markup


def test_the_title_is_bold_the_count_dim_and_the_line_is_cut_never_wrapped() -> None:
    first = Notification("polling every 2s", "", "information", 2)
    leak = Notification("leaky", "[b]KV LEAK[/b]", "error", 30)
    text = message_text([first, first, leak])
    assert text.plain == "[b]KV LEAK[/b]: leaky  (+2 more)"
    assert text.spans == [Span(0, 16, "bold"), Span(21, 32, "dim")]
    assert (text.no_wrap, text.overflow) == (True, "ellipsis")
    alone = message_text([first])
    assert alone.spans == [] and (alone.no_wrap, alone.overflow) == (True, "ellipsis")


def test_control_bytes_in_a_title_or_message_are_shown_escaped() -> None:
    hostile = Notification("red\x1b[31m\nbell\x07", "h\x1bost", "error", 5)
    assert message_text([hostile]).plain == "h\\x1bost: red\\x1b[31m\\x0abell\\x07"


class LineApp(App[None]):
    """A footer and a message line, messages shown as kvtop's app shows them."""

    CSS_PATH = STYLESHEET

    def compose(self) -> ComposeResult:
        yield Footer()
        yield MessageLine()

    def _refresh_notifications(self) -> None:
        show_messages(self, list(self._notifications))


async def shown(app: LineApp, pilot: Any) -> tuple[bool, bool, str]:
    """(the message line shown, the footer shown, what the line says)."""
    await pilot.pause()
    line = app.query_one(MessageLine)
    return line.display, app.query_one(Footer).display, str(line.render())


async def test_a_live_message_takes_the_footer_s_line_in_its_severity_s_style() -> None:
    app = LineApp()
    async with app.run_test(size=(60, 10)) as pilot:
        line = app.query_one(MessageLine)
        assert await shown(app, pilot) == (False, True, "")
        for count, (severity, role) in enumerate((("warning", "-warn"), ("error", "-bad"),
                                                  ("information", "-info"))):
            app.notify("[b]disk full[/b]", title="record", severity=severity, timeout=30)
            more = f"  (+{count} more)" if count else ""
            assert await shown(app, pilot) == (True, False, f"record: [b]disk full[/b]{more}")
            assert line.classes == {role}
        app.clear_notifications()
        assert (await shown(app, pilot))[:2] == (False, True)


async def test_a_severity_it_does_not_know_is_shown_as_information() -> None:
    app = LineApp()
    async with app.run_test(size=(60, 10)):
        line = app.query_one(MessageLine)
        debug = Notification("hi", "", "debug", 5)  # type: ignore[arg-type]
        assert line.show([debug]) is True
        assert line.classes == {"-info"} and line.display
        assert line.show([]) is False and not line.display


async def test_the_line_goes_when_its_first_message_expires_and_not_before() -> None:
    app = LineApp()
    async with app.run_test(size=(60, 10)) as pilot:
        app.notify("polling every 2s", timeout=0.3)
        app.notify("leak", timeout=30)
        assert (await shown(app, pilot))[2] == "leak  (+1 more)"
        started = time.monotonic()
        while time.monotonic() - started < 0.7:
            await pilot.pause(0.05)
        assert await shown(app, pilot) == (True, False, "leak")
        app.clear_notifications()
        app.notify("saved", timeout=0.3)
        assert (await shown(app, pilot))[:2] == (True, False)
        await pilot.pause(0.7)
        assert await shown(app, pilot) == (False, True, "saved")


async def test_a_screen_without_a_message_line_shows_them_once_it_closes() -> None:
    app = LineApp()
    async with app.run_test(size=(60, 10)) as pilot:
        await app.push_screen(Screen())
        app.notify("saved", timeout=30)
        await pilot.pause()
        assert not app.screen.query(MessageLine)
        app.pop_screen()
        assert await shown(app, pilot) == (True, False, "saved")


def test_an_app_with_no_screen_yet_shows_nothing() -> None:
    app = LineApp()
    assert show_messages(app, [Notification("early", "", "information", 5)]) is None
