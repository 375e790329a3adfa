"""The one-line fleet summary above the table."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from kvtop.ui import format as fmt
from kvtop.ui.fleet import FleetSummary

# (priority, text pieces): a lower priority survives a narrower terminal
Part = tuple[int, list[tuple[str, str]]]


class SummaryBar(Static):
    """Hosts up, leak counts, fleet KV weighted by capacity, queue, view settings, and
    whether a recording is being written (and what went wrong with it)."""

    COMPONENT_CLASSES = {  # noqa: RUF012
        "summary--key", "summary--bad", "summary--flag", "summary--ok", "summary--warn",
    }
    _shown: Text | None = None

    def show(
        self,
        summary: FleetSummary,
        *,
        interval_s: float,
        sort_label: str,
        filter_text: str,
        paused: bool,
        recording: str | None = None,
    ) -> None:
        down = summary.hosts_up < summary.hosts_total
        parts: list[Part] = [
            (0, [("hosts ", "key"), (f"{summary.hosts_up}/{summary.hosts_total}",
                                     "bad" if down else "")]),
            (0, _leak_part(summary)),
            (1, [("KV ", "key"), (fmt.kv_cell(summary.kv_usage, summary.blocks_used,
                                              summary.blocks_total), "")]),
            (2, [("run ", "key"), (fmt.count(summary.running), "")]),
            (1, [("queue ", "key"), (fmt.count(summary.waiting), "")]),
            (4, [("every ", "key"), (f"{interval_s:g}s", "")]),
            (3, [("sort ", "key"), (sort_label, "")]),
        ]
        if filter_text:
            parts.append((0, [("filter ", "key"), (repr(filter_text), "")]))
        if paused:
            parts.append((0, [("PAUSED", "flag")]))
        if recording is not None:  # "" while recording well; else what went wrong
            parts.append((0, [("REC ", "bad"), (recording, "bad")]) if recording
                         else (3, [("REC", "key")]))
        text = self._assemble(_fit(parts, self.content_size.width or 200))
        if text != self._shown:  # one line, fixed height: repaint, no layout
            self._shown = text
            self.update(text, layout=False)

    def _assemble(self, parts: list[Part]) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        for _, pieces in parts:
            if text:
                text.append("  ")
            for piece, role in pieces:
                text.append(piece, self.get_component_rich_style(f"summary--{role}")
                            if role else "")
        return text


def _leak_part(summary: FleetSummary) -> list[tuple[str, str]]:
    if summary.leaks or summary.watches:
        pieces = [(f"LEAK {summary.leaks}", "flag")] if summary.leaks else []
        if summary.watches:
            pieces += [(" " if pieces else "", ""), (f"WATCH {summary.watches}", "warn")]
        return pieces
    if summary.judged:
        return [("no leak", "ok")]
    return [("leak check …", "key")]


def _fit(parts: list[Part], width: int) -> list[Part]:
    """Drop the least important parts until the line fits ``width`` cells."""
    def length(kept: list[Part]) -> int:
        return sum(len(p) for _, pieces in kept for p, _ in pieces) + 2 * (len(kept) - 1)

    kept = list(parts)
    for part in sorted(parts, key=lambda p: -p[0]):
        if length(kept) <= width or part[0] == 0:
            break
        kept.remove(part)
    return kept
