"""The `?` help screen: every key the app and the fleet table answer to."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

Keys = tuple[tuple[str, str], ...]

KEYS: Keys = (
    ("q", "quit"),
    ("s", "snapshot: JSON, raw /metrics and an SVG of the screen"),
    ("p", "pause the display (collection goes on)"),
    ("↑ ↓ j k", "select a row (its numbers and KV sparkline show below)"),
    ("enter", "detail of the selected engine (escape goes back)"),
    ("tab", "switch pane (fleet / GPUs)"),
    ("/", "filter rows (all hosts); escape clears"),
    ("o", "cycle the sort key (name, KV, queue, preemptions, generation, leak)"),
    ("+ -", "longer / shorter polling interval"),
    ("g", "show or hide the GPU pane"),
    ("?", "this help"),
)

LEAK_LEGEND = (
    "LEAK column: OK · WATCH (weak evidence) · LEAK (strong) · … warming up;\n"
    "+N/h is how fast the used-block floor rises, in blocks per hour."
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [  # noqa: RUF012 - Textual's class-level binding list
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def __init__(self, keys: Keys = KEYS) -> None:
        super().__init__()
        self._keys = keys

    def compose(self) -> ComposeResult:
        width = max(len(k) for k, _ in self._keys)
        lines = "\n".join(f"{key:>{width}}  {what}" for key, what in self._keys)
        yield Static(f"kvtop keys\n\n{lines}\n\n{LEAK_LEGEND}\n\nescape closes", id="help-body")
