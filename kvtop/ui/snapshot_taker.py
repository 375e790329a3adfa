"""``s``: a snapshot of what the app holds now (the JSON document, each server's last body
and an SVG of the screen), gathered on the UI thread so it is consistent, written in a
worker thread so a slow disk never freezes the screen (kvtop/report/snapshot_files.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtop.derive.gpu_owners import GpuSource, GpuView, source_json, view_json
from kvtop.safe_text import display_text

if TYPE_CHECKING:
    from textual.app import App

    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import EngineKey, TargetState
    from kvtop.report.snapshot_files import SnapshotFiles

Histories = Mapping[str, Mapping["EngineKey", Iterable["EngineStats"]]]  # url -> engine -> stats


class SnapshotTaker:
    def __init__(self, app: App[Any], folder: Path | None, span_s: float) -> None:
        """``folder``: where snapshots go (None: the XDG state directory's);
        ``span_s``: how much of each engine's history the document holds."""
        self._app = app
        self._folder = folder
        self._span_s = span_s

    def take(self, now: float, states: list[TargetState], histories: Histories,
             gpu_views: list[GpuView], gpu_sources: list[GpuSource]) -> None:
        from kvtop.report.snapshot import snapshot_document  # imported when first asked
        from kvtop.report.snapshot_files import SnapshotFiles, stamp

        taken_at = datetime.fromtimestamp(now, tz=timezone.utc)
        history = {url: {key: [s for s in series if now - s.t <= self._span_s]
                         for key, series in engines.items()}
                   for url, engines in histories.items()}
        document = snapshot_document(
            states, [view_json(view) for view in gpu_views], taken_at=taken_at,
            history=history, gpu_sources=[source_json(source) for source in gpu_sources],
        )
        bodies = [(s.target.label, s.last_body) for s in states if s.last_body is not None]
        svg = self._app.export_screenshot(title=f"kvtop {stamp(taken_at)}")
        files = SnapshotFiles(taken_at, document, bodies, svg)
        self._app.run_worker(partial(self._write, files), name="write_snapshot",
                             group="snapshot", thread=True, exit_on_error=False)

    def _write(self, files: SnapshotFiles) -> None:
        from kvtop.report.snapshot_files import default_snapshot_dir, write_snapshot

        try:
            path = write_snapshot(self._folder, files)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            where = self._folder or default_snapshot_dir()
            self._app.call_from_thread(
                self._app.notify, display_text(f"Snapshot not written: {where} ({reason})"),
                severity="error", timeout=8, markup=False)
            return
        self._app.call_from_thread(self._app.notify, display_text(f"Snapshot saved to {path}"),
                                   timeout=8, markup=False)
