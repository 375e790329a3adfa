"""The selected engine's KV cache beside its KV chart: what limits it, blocks stored and
removed, reuse by tier, residency, and the exact leak evidence of its KV events (a witness
of its own). The lines come from kvtop/view/cache.py; a short pane keeps the first ones."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from kvtop.ui.widgets.panes import ROLES, Styled
from kvtop.view.engine import EngineView, Line


class CachePane(Styled, Static):
    COMPONENT_CLASSES = {f"pane--{role}" for role in ROLES}  # noqa: RUF012
    PREFIX = "pane"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._styles = {}
        self._shown: Text | None = None
        self.border_title = "KV cache"

    def show_engine(self, view: EngineView) -> None:
        """The engine the panes show (EnginePanes calls it with theirs)."""
        self.show(view.cache)

    def show(self, lines: list[Line]) -> None:
        text = Text("\n").join(self.line_text(line) for line in lines)
        if text != self._shown:
            self._shown = text
            self.update(text)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._shown = None
