"""The one-line fleet summary above the table."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from kvtop.ui import format as fmt
from kvtop.ui.fleet import FleetSummary


class SummaryBar(Static):
    """Hosts up, fleet KV weighted by capacity, total running and queue, and view settings."""

    COMPONENT_CLASSES = {"summary--key", "summary--bad", "summary--flag"}  # noqa: RUF012

    def show(
        self,
        summary: FleetSummary,
        *,
        interval_s: float,
        sort_label: str,
        filter_text: str,
        paused: bool,
    ) -> None:
        key = self.get_component_rich_style("summary--key")
        bad = self.get_component_rich_style("summary--bad")
        flag = self.get_component_rich_style("summary--flag")
        down = summary.hosts_up < summary.hosts_total
        text = Text.assemble(
            ("hosts ", key),
            (f"{summary.hosts_up}/{summary.hosts_total}", bad if down else ""),
            ("  KV ", key),
            fmt.kv_cell(summary.kv_usage, summary.blocks_used, summary.blocks_total),
            ("  run ", key),
            fmt.count(summary.running),
            ("  queue ", key),
            fmt.count(summary.waiting),
            ("  every ", key),
            f"{interval_s:g}s",
            ("  sort ", key),
            sort_label,
        )
        if filter_text:
            text.append("  filter ", key).append(repr(filter_text))
        if paused:
            text.append("  PAUSED", flag)
        self.update(text)
