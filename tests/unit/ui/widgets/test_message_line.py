"""The message line: the newest live message with its title, never read as markup, and how
many more are live."""

from __future__ import annotations

from textual.notifications import Notification

from kvtop.ui.widgets.message_line import message_text


def test_the_newest_message_with_its_title_and_how_many_more() -> None:
    assert message_text([]) is None
    first = Notification("polling every 2s", "", "information", 2)
    leak = Notification("leaky: 828 blocks held [/bold]", "KV LEAK", "error", 30)
    assert message_text([first]).plain == "polling every 2s"
    text = message_text([first, leak])
    assert text.plain == "KV LEAK: leaky: 828 blocks held [/bold]  (+1 more)"  # not markup
