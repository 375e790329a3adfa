"""The header's meters, as htop has them: the fleet's KV blocks on a bar with eighth-cell
resolution, hosts up, leak and stall counts; then requests, hit rate, tokens/s and the
view's settings. The numbers are the fleet's: a search says how many rows it shows
("3 of 40 shown") and changes no number. Where the line is too narrow, the view's settings
and then a GPU note go first; the fleet's load, hit rate and tokens/s stay."""

from __future__ import annotations

from typing import TypedDict

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from kvtop.view import format as fmt
from kvtop.view.cache import limits_text
from kvtop.view.fleet_summary import FleetSummary

Pieces = list[tuple[str, str]]
Part = tuple[int, Pieces]  # (priority, pieces): a lower priority survives a narrower terminal
BAR_MIN, BAR_MAX = 10, 60  # cells of the KV meter's bar


class _Settings(TypedDict):
    """What show() was last given besides the summary: drawn again on a resize."""

    interval_s: float
    sort_label: str
    filter_text: str
    paused: bool
    shown: tuple[int, int] | None
    recording: str | None
    group_label: str
    gpu_note: tuple[str, str] | None


class SummaryBar(Static):
    """Two lines: the KV meter with hosts and verdict counts, then load and settings
    (and whether a recording is being written, and what went wrong with it)."""

    COMPONENT_CLASSES = {  # noqa: RUF012
        "summary--key", "summary--bad", "summary--flag", "summary--ok", "summary--warn",
        "summary--bar", "summary--track",
    }
    _shown: Text | None = None
    _last: tuple[FleetSummary, _Settings] | None = None
    _styles: dict[str, Style] | None = None

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None

    def on_resize(self) -> None:
        """The bar takes the new width at once, not at the next refresh."""
        if self._last is not None:
            summary, options = self._last
            self.show(summary, **options)

    def show(
        self,
        summary: FleetSummary,
        *,
        interval_s: float,
        sort_label: str,
        filter_text: str,
        paused: bool,
        shown: tuple[int, int] | None = None,
        recording: str | None = None,
        group_label: str = "",
        gpu_note: tuple[str, str] | None = None,
    ) -> None:
        """``shown``: (rows the search leaves, rows in all), said while searching."""
        self._last = (summary, {"interval_s": interval_s, "sort_label": sort_label,
                                "filter_text": filter_text, "shown": shown, "paused": paused,
                                "recording": recording, "group_label": group_label,
                                "gpu_note": gpu_note})
        width = self.content_size.width or 200
        settings: list[Part] = [
            (4, [("every ", "key"), (f"{interval_s:g}s", "")]),
            (3, [("sort ", "key"), (sort_label, "")]),
        ]
        if group_label:
            settings.append((2, [("groups ", "key"), (group_label, "")]))
        if filter_text:
            count = f" {shown[0]} of {shown[1]} shown" if shown is not None else ""
            settings.append((0, [("filter ", "key"), (repr(filter_text), "warn"),
                                 (count, "key")]))
        if paused:
            settings.append((0, [("PAUSED", "flag")]))
        if recording is not None:  # "" while recording well; else what went wrong
            settings.append((0, [("REC ", "bad"), (recording, "bad")]) if recording
                            else (3, [("REC", "key")]))
        first = self._meter_line(summary, width)
        second = self._assemble(_with_note([*_load_parts(summary), *settings], gpu_note, width))
        text = Text("\n", no_wrap=True, overflow="ellipsis").join([first, second])
        if text != self._shown:  # fixed height: repaint, no layout
            self._shown = text
            self.update(text, layout=False)

    def _meter_line(self, summary: FleetSummary, width: int) -> Text:
        """``KV [████████▉     ] 2258/7996 28%  hosts 4/4  LEAK 1  STALL 0``: the bar
        takes the width the rest leaves."""
        usage = summary.kv_usage
        blocks = (f" {fmt.count(summary.blocks_used)}/{fmt.count(summary.blocks_total)} "
                  f"blocks {fmt.percent(usage)}" if usage is not None else " –")
        right = _fit([_hosts_part(summary), (0, _verdict_part(summary))], width)
        right_w = sum(len(p) for _, pieces in right for p, _ in pieces) + 2 * len(right)
        cells = min(max(width - right_w - len(blocks) - 5, BAR_MIN), BAR_MAX)
        bar = fmt.bar(usage, cells)
        filled = bar.rstrip("░·")
        head: Pieces = [("KV ", "key"), ("[", "key"), (filled, _usage_role(usage)),
                        (bar[len(filled):], "track"), ("]", "key"), (blocks, "")]
        return self._assemble([(0, head), *right])

    def _assemble(self, parts: list[Part]) -> Text:
        """One line; show() joins two into a Text that cuts them at the edge."""
        text = Text()
        for _, pieces in parts:
            if text:
                text.append("  ")
            for piece, role in pieces:
                text.append(piece, self._style(role))
        return text

    def _style(self, role: str) -> Style | None:
        if not role:
            return None
        if self._styles is None:
            self._styles = {}
        style = self._styles.get(role)
        if style is None:
            try:
                style = self._styles[role] = self.get_component_rich_style(f"summary--{role}")
            except KeyError:  # the app is tearing down: its stylesheet is gone
                return None
        return style


def _usage_role(usage: float | None) -> str:
    if usage is not None and usage >= 0.95:
        return "bad"
    return "warn" if usage is not None and usage >= 0.8 else "bar"


def _hosts_part(summary: FleetSummary) -> Part:
    down = summary.hosts_up < summary.hosts_total
    return (0, [("hosts ", "key"), (f"{summary.hosts_up}/{summary.hosts_total}",
                                    "bad" if down else ""), (" up", "key")])


def _verdict_part(summary: FleetSummary) -> Pieces:
    """LEAK / WATCH / STALL counts, loud only when not zero; SATURATED only when some
    pool is (full but moving: worth seeing, not worth a permanent slot)."""
    counts = [("LEAK", summary.leaks, "flag"), ("WATCH", summary.watches, "warn"),
              ("STALL", summary.stalls, "flag")]
    if summary.saturated:
        counts.append(("SATURATED", summary.saturated, "warn"))
    pieces: Pieces = []
    for label, count, role in counts:
        if pieces:
            pieces.append((" ", ""))
        pieces.append((f"{label} {count}", role if count else "key"))
    return pieces


def _load_parts(summary: FleetSummary) -> list[Part]:
    waiting = summary.waiting
    limits: list[Part] = ([(1, [("held by ", "key"), (limits_text(summary.limits), "warn")])]
                          if summary.limits else [])
    return [
        (0, [("run ", "key"), (fmt.count(summary.running), "")]),
        (0, [("wait ", "key"), (fmt.count(waiting), "warn" if waiting else "")]),
        *limits,
        (1, [("hit ", "key"), (fmt.percent(summary.hit_rate), "")]),
        (1, [("tok/s ", "key"), (f"{fmt.rate(summary.prompt_tps)} in "
                                 f"{fmt.rate(summary.generation_tps)} out", "")]),
    ]


NOTE_PRIORITY = 9  # the first part to go: a GPU that can't be read is a note, not news


def _with_note(parts: list[Part], note: tuple[str, str] | None, width: int) -> list[Part]:
    """``parts`` fitted to ``width`` with the GPU note (short, full): the full one where it
    fits, else the short one, else none; never at the cost of another part."""
    fitted = _fit(parts, width)
    if note is None:
        return fitted
    for text in note[::-1]:
        with_note = [*fitted, (NOTE_PRIORITY, [("GPU ", "key"), (text, "warn")])]
        if _fit(with_note, width) == with_note:
            return with_note
    return fitted


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
