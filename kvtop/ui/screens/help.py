"""The `?` help screen: every key the app and the fleet table answer to."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("q", "quit"),
    ("s", "snapshot: JSON, raw /metrics and an SVG of the screen"),
    ("p", "pause the display (collection goes on)"),
    ("↑ ↓ j k", "select a row"),
    ("enter", "detail of the selected engine (escape goes back)"),
    ("tab", "switch pane (fleet / GPUs)"),
    ("/", "filter rows (all hosts); escape clears"),
    ("o", "cycle the sort key"),
    ("+ -", "longer / shorter polling interval"),
    ("g", "show or hide the GPU pane"),
    ("?", "this help"),
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [  # noqa: RUF012 - Textual's class-level binding list
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        width = max(len(k) for k, _ in KEYS)
        lines = "\n".join(f"{key:>{width}}  {what}" for key, what in KEYS)
        yield Static(f"kvtop keys\n\n{lines}\n\nescape closes", id="help-body")
