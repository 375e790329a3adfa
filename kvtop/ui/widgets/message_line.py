"""The app's messages on the footer's line, as htop and vim say things: a snapshot's path,
a LEAK alert, the interval now. A toast would sit over the panes for seconds (at 80x24 over
the numbers beside the sparklines); this line takes the key hints' place while a message is
live and gives it back when it expires. The newest message is shown, with how many more
are live."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import App, ScreenStackError
from textual.widgets import Footer, Static

from kvtop.safe_text import plain

if TYPE_CHECKING:
    from textual.notifications import Notification

ROLE = {"information": "info", "warning": "warn", "error": "bad"}


def message_text(live: Sequence[Notification]) -> Text | None:
    """The newest of ``live`` as one line (its title first), never read as markup; None
    when nothing is live."""
    if not live:
        return None
    newest = live[-1]
    text = Text(no_wrap=True, overflow="ellipsis")
    if newest.title:
        text.append_text(plain(f"{newest.title}: ", "bold"))
    text.append_text(plain(newest.message))
    if len(live) > 1:
        text.append_text(plain(f"  (+{len(live) - 1} more)", "dim"))
    return text


class MessageLine(Static):
    """Shows the newest live message, styled by its severity (kvtop.tcss); hidden when
    there is none."""

    def show(self, live: Sequence[Notification]) -> bool:
        """Show ``live``'s newest message; returns whether one is shown."""
        text = message_text(live)
        self.display = text is not None
        if text is not None:
            self.set_classes(f"-{ROLE.get(live[-1].severity, 'info')}")
            self.update(text)
        return text is not None


def show_messages(app: App[object], live: Sequence[Notification]) -> None:
    """``live`` on the active screen's message line in place of its footer; looked at again
    when the first of them expires. A screen without one (help, the sort menu) shows them
    once it closes (Textual refreshes the messages when a screen resumes)."""
    try:
        screen = app.screen
    except ScreenStackError:
        return
    lines = screen.query(MessageLine)
    if not lines:
        return
    shown = lines.first().show(live)
    for footer in screen.query(Footer):
        footer.display = not shown
    if live:
        first_out = max(min(n.time_left for n in live), 0.0)
        app.set_timer(first_out + 0.05, app._refresh_notifications)
