"""Alerts while watching: when an engine enters LEAK (or STALLED), a terminal bell and, if
configured, a command run with the event as JSON on its stdin.

The command is an argv list from the config, run without a shell (nothing in an event can
become shell syntax), at most once per engine and verdict per ``min_interval_s`` and at
most ``max_per_minute`` times in all; a command that fails or hangs is reported on the
screen and never stops the app. The event document is docs/alerts.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

import orjson

from kvtop.config import AlertSettings
from kvtop.safe_text import display_text

if TYPE_CHECKING:
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import TargetState

AlertKind = Literal["leak", "stall"]
ALERT_VERSION = 1
STDERR_QUOTE = 200  # characters of a failing command's stderr shown


@dataclass(frozen=True, slots=True)
class AlertEvent:
    kind: AlertKind
    key: str  # the engine's row key
    state: TargetState
    stats: EngineStats
    t: float

    @property
    def reason(self) -> str:
        verdict = self.stats.leak if self.kind == "leak" else self.stats.stall
        return verdict.reason if verdict is not None else ""

    def document(self) -> dict[str, Any]:
        """The JSON the command reads (docs/alerts.md): exact values, never the token."""
        from kvtop.report.snapshot import leak_json, stall_json

        stats, target = self.stats, self.state.target
        return {
            "kvtop_alert": ALERT_VERSION,
            "event": self.kind,
            "at": datetime.fromtimestamp(self.t, tz=timezone.utc).isoformat(),
            "target": target.url,
            "name": target.label,
            "group": target.group,
            "model": stats.model,
            "engine": stats.engine,
            "reason": self.reason,
            "kv": {"usage": stats.kv_usage, "blocks_used": stats.blocks_used,
                   "blocks_total": stats.blocks_total},
            "requests": {"running": stats.running, "waiting": stats.waiting},
            "leak": leak_json(stats.leak),
            "stall": stall_json(stats.stall),
        }


class AlertRunner:
    """Runs the configured command for events, rate-limited; says what went wrong."""

    def __init__(self, settings: AlertSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._last: dict[tuple[str, AlertKind], float] = {}
        self._recent: deque[float] = deque()
        self.dropped = 0  # events not run because of the limits

    def due(self, event: AlertEvent) -> bool:
        """Whether the command runs for ``event`` now (and count it if so)."""
        if not self.settings.command:
            return False
        now = self._clock()
        last = self._last.get((event.key, event.kind))
        while self._recent and now - self._recent[0] >= 60.0:
            self._recent.popleft()
        if (last is not None and now - last < self.settings.min_interval_s) or (
                len(self._recent) >= self.settings.max_per_minute):
            self.dropped += 1
            return False
        self._last[(event.key, event.kind)] = now
        self._recent.append(now)
        return True

    async def run(self, event: AlertEvent) -> str | None:
        """Run the command with the event on stdin; None when it succeeded, else why not
        (one line, safe to show)."""
        argv = self.settings.command
        payload = orjson.dumps(event.document()) + b"\n"
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            return _said(argv, exc.strerror or str(exc))
        try:
            _, stderr = await asyncio.wait_for(process.communicate(payload),
                                               self.settings.timeout_s)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            return _said(argv, f"no exit after {self.settings.timeout_s:g} s: killed")
        if process.returncode:
            quote = stderr.decode(errors="replace").strip().splitlines()
            detail = f": {quote[-1][:STDERR_QUOTE]}" if quote else ""
            return _said(argv, f"exit status {process.returncode}{detail}")
        return None


def _said(argv: tuple[str, ...], what: str) -> str:
    return display_text(f"alert command {argv[0]}: {what}", 300)
