"""``kvtop replay FILE``: the terminal app on a recording, with pause, step, seek and speed.

The app is the live one with a :class:`ReplaySource` instead of the poller, and the replay's
clock as its clock, so ages, plots, rates and the leak indicator come from the same code as
live. Seeking backwards rebuilds the trackers from the recording's start (``on_rewind``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.widgets import Static

from kvtop.collect.target import Scrape
from kvtop.exits import EXIT_NO_DATA, EXIT_USAGE
from kvtop.safe_text import display_text, warn
from kvtop.store.recording import RecordingError, open_recording
from kvtop.store.replay import ReplaySource
from kvtop.ui.app import INTERVALS, AppConfig, KvtopApp, app_exit_code
from kvtop.ui.keys import REPLAY_BINDINGS
from kvtop.ui.screens.help import KEYS
from kvtop.view import format as fmt

if TYPE_CHECKING:
    from kvtop.baseline.overlay import BaselineOverlay

SEEK_S = 60.0  # [ ]
SEEK_FAR_S = 600.0  # { }
YIELD_EVERY = 100  # scrapes folded between yields while a seek catches up
REPLAY_KEYS = (
    ("space", "pause / resume the replay"),
    (".", "step a round of scrapes"),
    ("[ ]", f"seek back / forward {fmt.age(SEEK_S)}"),
    ("{ }", f"seek back / forward {fmt.age(SEEK_FAR_S)}"),
    ("< >", "replay speed ×0.5 / ×2"),
)


def clock_text(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def position(seconds: float) -> str:
    """A position in the recording: 4:05 or 1:02:03."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ReplayBar(Static):
    """The replay's clock: play state, speed, recording time and position/length."""

    COMPONENT_CLASSES = {"replay--flag", "replay--key"}  # noqa: RUF012

    def show(self, source: ReplaySource, name: str) -> None:
        flag = self.get_component_rich_style("replay--flag")
        key = self.get_component_rich_style("replay--key")
        if source.finished and source.paused:
            mode = "■ END"
        else:
            mode = "❚❚ PAUSED" if source.paused else "▶ REPLAY"
        now = source.now()
        text = Text.assemble(
            (mode, flag), (f" ×{source.speed:g}  ", ""), (clock_text(now), ""),
            ("  ", ""), (position(now - source.start_t), ""),
            (f"/{position(source.end_t - source.start_t)}  ", key), (name, key),
            no_wrap=True, overflow="ellipsis",
        )
        self.update(text)


class ReplayApp(KvtopApp):
    """The live app on a recording; the replay keys drive its :class:`ReplaySource`."""

    BINDINGS = REPLAY_BINDINGS
    HELP_KEYS = REPLAY_KEYS + tuple(k for k in KEYS if k[0] != "+ -")

    def __init__(self, config: AppConfig, source: ReplaySource, name: str) -> None:
        super().__init__(config)
        self.replay = source
        self.replay_name = display_text(name)
        source.on_rewind = self.reset_trackers
        self._delivered = 0

    def compose(self) -> ComposeResult:
        yield ReplayBar(id="replay")
        yield from super().compose()

    def on_mount(self) -> None:
        self.replay_bar = self.query_one(ReplayBar)
        super().on_mount()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The recording's interval is fixed. (The search box keeps the `.` typed into it:
        Textual offers no binding of a printable key while an Input has the focus.)"""
        return action != "interval"

    @work(group="collect", exit_on_error=False)
    async def _collect(self) -> None:
        await self.replay.run(self._paced_scrape, stop=self._stop)

    async def _paced_scrape(self, scrape: Scrape) -> None:
        """Fold as live does; a seek that re-delivers hours of scrapes still lets keys in."""
        self.on_scrape(scrape)
        self._delivered += 1
        if self._delivered % YIELD_EVERY == 0:
            await asyncio.sleep(0)

    def _draw(self, *, force: bool = False) -> None:
        super()._draw(force=force)
        self._show_bar()

    def _show_bar(self) -> None:
        if self._on_screen():  # a timed draw may land while the app shuts down
            self.replay_bar.show(self.replay, self.replay_name)

    def _moved(self) -> None:
        """Show a pause, step or seek at once instead of at the next redraw period."""
        self._show_bar()
        self.set_timer(0.05, self._draw)

    def action_play_pause(self) -> None:
        self.replay.toggle_pause()
        self._moved()

    def action_step(self) -> None:
        if not self.replay.paused:
            self.replay.toggle_pause()
        self.replay.step()
        self._moved()

    def action_seek(self, minutes_or_tens: int) -> None:
        amount = SEEK_FAR_S if abs(minutes_or_tens) == 10 else SEEK_S
        direction = 1 if minutes_or_tens > 0 else -1
        self.replay.seek(self.replay.now() + direction * amount)
        self._moved()

    def action_speed(self, factor: float) -> None:
        self.replay.set_speed(self.replay.speed * factor)
        self.notify(f"replay speed ×{self.replay.speed:g}", timeout=2, markup=False)
        self._moved()


class NothingToReplay(Exception):
    """A readable recording without a single scrape."""


def replay_app(path: Path, *, speed: float = 1.0, snapshot_dir: Path | None = None,
               tell: Callable[[str], None] = lambda _: None,
               baseline: BaselineOverlay | None = None) -> ReplayApp:
    """The app on the recording at ``path``, streamed from disk (never held whole).
    Raises RecordingError (unreadable) or NothingToReplay; ``tell`` gets the lines skipped."""
    recording = open_recording(path)
    if not recording.count:
        raise NothingToReplay(f"{path} holds no scrapes")
    for warning in recording.warnings:
        tell(f"{path}: {warning}")
    # the batches go to the app's KV events tap (the app is made below, before any is read);
    # a recording without any reads the same either way
    app: ReplayApp
    source = ReplaySource(recording, speed=speed,
                          on_kv_events=lambda item: app.kv_events.fold(item))
    config = AppConfig(
        targets=recording.targets(),
        # the redraw period follows the interval: kept to what the live app offers
        interval_s=min(max(recording.interval_s, INTERVALS[0]), INTERVALS[-1]),
        no_gpu=True,  # this machine's GPUs say nothing about the recording
        snapshot_dir=snapshot_dir,
        source_factory=lambda _: source,
        clock=source.now,
        baseline=baseline,
    )
    app = ReplayApp(config, source, path.name)
    return app


def run_replay(path: Path, *, speed: float = 1.0, snapshot_dir: Path | None = None,
               baseline: BaselineOverlay | None = None) -> int:
    """Open the app on the recording at ``path``. Returns 0, 2 (unreadable), 3 (no scrapes)
    or 70 (the app crashed)."""
    def tell(text: str) -> None:
        warn(f"kvtop replay: {text}")

    try:
        app = replay_app(path, speed=speed, snapshot_dir=snapshot_dir, tell=tell,
                         baseline=baseline)
    except RecordingError as exc:
        tell(str(exc))
        return EXIT_USAGE
    except NothingToReplay as exc:
        tell(str(exc))
        return EXIT_NO_DATA
    app.run()
    return app_exit_code(app)
