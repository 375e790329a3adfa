"""The app's recording (``--record``): every scrape and KV event batch written as it is
folded (the writer never raises: a full disk costs the recording, never the monitoring),
flushed every few seconds so a crash loses little, and trouble told once as a toast, then
shown in the header for as long as the app runs. Without ``--record`` the tap is there and
does nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvtop.safe_text import display_text

if TYPE_CHECKING:
    from textual.app import App

    from kvtop.collect.kv_endpoint import TargetKvEvents
    from kvtop.collect.target import Scrape
    from kvtop.store.writer import RecordingWriter

RECORD_FLUSH_S = 5.0  # a crash loses at most this much of a recording


class RecordingTap:
    def __init__(self, app: App[Any], writer: RecordingWriter | None,
                 on_trouble: Callable[[], None]) -> None:
        """``writer`` (None: not recording) is opened by the caller, so that an unwritable
        path fails before the screen is taken over; ``on_trouble`` redraws the header when
        trouble starts."""
        self._app = app
        self.writer = writer  # None once closed
        self._on_trouble = on_trouble
        self._told = (False, False, False)  # failing, full, end lost: already notified

    def start(self) -> None:
        if self.writer is not None:
            self._app.set_interval(RECORD_FLUSH_S, self.flush, name="record-flush")

    def write(self, scrape: Scrape) -> None:
        if self.writer is not None:  # a late scrape after closing must not write
            self.writer.write(scrape)
            self._tell_trouble(self.writer)

    def write_kv_events(self, item: TargetKvEvents) -> None:
        if self.writer is not None:
            self.writer.write_kv_events(item.batch, item.target)
            self._tell_trouble(self.writer)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self._tell_trouble(self.writer)

    def close(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()

    def status(self) -> str | None:
        """For the header: None when not recording, "" while all is well, else what went
        wrong."""
        return None if self.writer is None else self.writer.status() or ""

    def _tell_trouble(self, writer: RecordingWriter) -> None:
        """A toast when writing starts failing, the size limit is reached or the end is
        lost."""
        now = (writer.failing, writer.full, writer.end_lost)
        if any(new and not old for new, old in zip(now, self._told, strict=True)):
            self._app.notify(display_text(f"{writer.path}: {writer.status()}"),
                             title="Recording", severity="error", timeout=10, markup=False)
            self._on_trouble()
        self._told = now
