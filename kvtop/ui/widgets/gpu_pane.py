"""The GPU pane: every GPU kvtop sees (local NVML, GPU exporters), beside the KV view."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from kvtop.ui.gpus import Line


class GpuPane(Static, can_focus=True):
    """Draws the lines :func:`kvtop.ui.gpus.pane_lines` makes: per GPU memory used/total,
    use, temperature, power, its servers, and processes (vLLM marked)."""

    COMPONENT_CLASSES = {  # noqa: RUF012
        "gpu--title", "gpu--vllm", "gpu--dim", "gpu--bad", "gpu--owner", "gpu--spark",
    }
    _shown: Text | None = None

    def show(self, lines: list[Line]) -> None:
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
