"""The GPU pane: every GPU kvtop sees (local NVML, GPU exporters), beside the KV view."""

from __future__ import annotations

from collections.abc import Callable

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from kvtop.view.gpus import Line


class GpuPane(Static, can_focus=True):
    """Draws the lines :func:`kvtop.view.gpus.pane_lines` makes: per GPU memory used/total,
    use, temperature, power, its servers, and processes (vLLM marked)."""

    COMPONENT_CLASSES = {  # noqa: RUF012
        "gpu--title", "gpu--vllm", "gpu--dim", "gpu--bad", "gpu--owner", "gpu--spark",
    }
    _shown: Text | None = None
    _lines_at: Callable[[int], list[Line]] | None = None

    def show(self, lines_at: Callable[[int], list[Line]]) -> None:
        """Draw ``lines_at(cells)``, the lines for a history ``cells`` wide; again on each
        resize, so the history takes the pane's width as soon as it has one."""
        self._lines_at = lines_at
        self._draw()

    def on_resize(self) -> None:
        if self._lines_at is not None:
            self._draw()

    def _draw(self) -> None:
        assert self._lines_at is not None
        lines = self._lines_at(self.content_size.width - 2)
        text = Text(no_wrap=True, overflow="ellipsis")
        styles: dict[str, Style | str] = {}
        for number, line in enumerate(lines):
            if number:
                text.append("\n")
            for piece, role in line:
                if role and role not in styles:
                    styles[role] = self._style(role)
                text.append(piece, styles.get(role, ""))
        self._set(text)

    def _style(self, role: str) -> Style | str:
        try:
            return self.get_component_rich_style(f"gpu--{role}")
        except KeyError:  # the app is tearing down: its stylesheet is gone
            return ""

    def _set(self, text: Text) -> None:
        if text != self._shown:  # GPU reads mostly repeat themselves
            self._shown = text
            self.update(text)
