"""The app's alerts: at each frame (paused or not: alerts are not display), the engines whose
leak indicator moved between OK, WATCH and LEAK, or that entered STALLED, each told once as
a toast; entering LEAK or STALLED also rings the bell and runs the configured command
(kvtop/alerts.py: rate-limited, in a worker, never able to take the app down)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvtop.alerts import AlertEvent, AlertRunner
from kvtop.safe_text import display_text
from kvtop.view import format as fmt
from kvtop.view.verdict_changes import LeakChange, leak_changes, stall_entries

if TYPE_CHECKING:
    from textual.app import App

    from kvtop.config import AlertSettings
    from kvtop.derive.tracker import TargetState
    from kvtop.derive.verdicts import LeakState

LEAK_NOTIFY_S = {"leak": 30.0, "watch": 15.0}  # how long a leak alert stays up


class AlertTap:
    def __init__(self, app: App[Any], settings: AlertSettings,
                 clock: Callable[[], float]) -> None:
        self._app = app
        self._settings = settings
        self._clock = clock
        self._runner = AlertRunner(settings)
        self._leak_seen: dict[str, LeakState] = {}  # row key -> last leak state told to the user
        self._stall_seen: dict[str, str] = {}  # row key -> last stall state

    def forget(self) -> None:
        """A replay rewound: what was told is told again as the scrapes come back."""
        self._leak_seen.clear()
        self._stall_seen.clear()

    def look(self, states: list[TargetState]) -> None:
        """Tell what changed since the last look."""
        changes, self._leak_seen = leak_changes(states, self._leak_seen)
        for change in changes:
            self._notify_leak(change)
        entered = [change for change in changes if change.verdict.state == "leak"]
        events = [AlertEvent("leak", change.key, change.state, change.stats, self._clock())
                  for change in entered]
        stalled, self._stall_seen = stall_entries(states, self._stall_seen)
        for entry in stalled:
            assert entry.stats.stall is not None
            self._app.notify(display_text(f"{entry.name}: {entry.stats.stall.reason}"),
                             title="STALLED", severity="error", timeout=LEAK_NOTIFY_S["leak"],
                             markup=False)
            events.append(AlertEvent("stall", entry.key, entry.state, entry.stats, self._clock()))
        if events:
            self._alert(events)

    def _alert(self, events: list[AlertEvent]) -> None:
        """A bell for the lot, and the configured command for each (rate-limited)."""
        if self._settings.bell:
            self._app.bell()
        for event in events:
            if self._runner.due(event):
                self._app.run_worker(self._run_command(event), name="run_alert",
                                     group="alerts", exit_on_error=False)

    async def _run_command(self, event: AlertEvent) -> None:
        try:
            failure = await self._runner.run(event)
        except Exception as exc:  # an alert command must never take the app down
            failure = display_text(f"alert command: {type(exc).__name__}: {exc}", 300)
        if failure is not None:
            self._app.notify(display_text(failure), title="Alert command failed", severity="error",
                             timeout=10, markup=False)

    def _notify_leak(self, change: LeakChange) -> None:
        verdict = change.verdict
        state = verdict.state
        if state in ("leak", "watch"):
            slope = verdict.slope_blocks_per_hour
            trend = f" ({fmt.slope(slope)})" if slope else ""
            self._app.notify(display_text(f"{change.name}: {verdict.reason}{trend}"),
                             title=f"KV {state.upper()}",
                             severity="error" if state == "leak" else "warning",
                             timeout=LEAK_NOTIFY_S[state], markup=False)
        else:
            self._app.notify(display_text(f"{change.name}: {verdict.reason}"),
                             title="KV leak indicator cleared", markup=False)
