"""Writing the `s` snapshot: JSON, raw /metrics bodies and an SVG screenshot, atomically.

Everything goes into a temporary folder that is renamed into place at the end, so a reader
never sees half a snapshot and a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class SnapshotFiles:
    """What one snapshot holds, already rendered to text on the UI thread."""

    taken_at: datetime
    document: dict[str, Any]  # the snapshot JSON contract plus history
    bodies: dict[str, str]  # target label -> last raw /metrics text
    screenshot_svg: str


def stamp(taken_at: datetime) -> str:
    return taken_at.strftime("%Y%m%dT%H%M%SZ")


def safe_name(label: str) -> str:
    """A file-name-safe form of a target label (host:port/path)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "target"


def write_snapshot(folder: Path, files: SnapshotFiles) -> Path:
    """Write ``kvtop-snapshot-<UTC stamp>/`` under ``folder``; returns its path.

    Raises OSError when the folder can't be written; the caller says so to the user.
    """
    name = f"kvtop-snapshot-{stamp(files.taken_at)}"
    final = folder / name
    n = 1
    while final.exists():  # two snapshots within one second
        n += 1
        final = folder / f"{name}-{n}"
    work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=folder))
    try:
        (work / f"{name}.json").write_text(
            json.dumps(files.document, indent=2, default=str) + "\n", encoding="utf-8"
        )
        metrics = work / "metrics"
        metrics.mkdir()
        for label, body in files.bodies.items():
            (metrics / f"{safe_name(label)}.txt").write_text(body, encoding="utf-8")
        (work / "screen.svg").write_text(files.screenshot_svg, encoding="utf-8")
        os.chmod(work, 0o755)  # mkdtemp makes it private; the snapshot is meant to be shared
        os.replace(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final
