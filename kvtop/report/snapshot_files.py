"""Writing the `s` snapshot: JSON, raw /metrics bodies and an SVG screenshot, atomically.

By default under the XDG state directory (``$XDG_STATE_HOME/kvtop/snapshots``, else
``~/.local/state/kvtop/snapshots``), as k9s keeps its dumps: never into whatever directory
kvtop was started in (a git checkout). ``--snapshot-dir`` names another.

Everything goes into a temporary folder that is renamed into place at the end, so a reader
never sees half a snapshot and a failure leaves nothing behind. Target labels come from
outside (a recording, Prometheus's instance labels): each becomes a short file name of its
own, and the SVG is kept valid XML whatever text was on the screen.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kvtop.safe_text import json_text, kept_text


@dataclass(frozen=True, slots=True)
class SnapshotFiles:
    """What one snapshot holds, already rendered to text on the UI thread."""

    taken_at: datetime
    document: dict[str, Any]  # the snapshot JSON contract plus history
    bodies: list[tuple[str, str]]  # (target label, last raw /metrics text); labels may repeat
    screenshot_svg: str


def stamp(taken_at: datetime) -> str:
    return taken_at.strftime("%Y%m%dT%H%M%SZ")


MAX_NAME = 80  # characters of a label kept in its file name (a file name has 255 bytes)
# Characters XML 1.0 forbids (most controls, lone surrogates, U+FFFE/U+FFFF): one in the SVG
# and no browser opens it.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def safe_name(label: str) -> str:
    """A file-name-safe form of a target label (host:port/path), at most ``MAX_NAME`` long."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_.")[:MAX_NAME] or "target"


def body_names(labels: list[str]) -> list[str]:
    """A file name (``.txt``) per label, all different even when labels repeat (one instance
    in two Prometheus jobs), make the same safe name (``a/b`` and ``a_b``) or differ only in
    case (the disk may not tell them apart)."""
    names = []
    taken: set[str] = set()
    for label in labels:
        stem = base = safe_name(label)
        n = 1
        while stem.lower() in taken:
            n += 1
            stem = f"{base}-{n}"
        taken.add(stem.lower())
        names.append(f"{stem}.txt")
    return names


def xml_safe(svg: str) -> str:
    """The SVG with any character XML forbids replaced (U+FFFD): it always parses."""
    return _NOT_XML.sub("\ufffd", svg)


def default_snapshot_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_STATE_HOME/kvtop/snapshots``; ``~/.local/state/kvtop/snapshots`` when it is
    unset, empty or relative (the XDG spec says to ignore a relative one)."""
    state = environ.get("XDG_STATE_HOME")
    base = Path(state) if state and Path(state).is_absolute() else (
        Path.home() / ".local" / "state")
    return base / "kvtop" / "snapshots"


def write_snapshot(folder: Path | None, files: SnapshotFiles) -> Path:
    """Write ``kvtop-snapshot-<UTC stamp>/`` under ``folder`` (None: the default, made if
    missing, private to the user); returns its absolute path.

    Raises OSError when the folder can't be written; the caller says so to the user.
    """
    if folder is None:
        folder = default_snapshot_dir()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = folder.absolute()
    name = f"kvtop-snapshot-{stamp(files.taken_at)}"
    final = folder / name
    n = 1
    while final.exists():  # two snapshots within one second
        n += 1
        final = folder / f"{name}-{n}"
    work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=folder))
    try:
        (work / f"{name}.json").write_text(
            json_text(files.document, indent=2, default=str) + "\n", encoding="utf-8"
        )
        metrics = work / "metrics"
        metrics.mkdir()
        names = body_names([label for label, _ in files.bodies])
        for name, (_, body) in zip(names, files.bodies, strict=True):
            # a body from a recording may hold a lone surrogate: never fail the snapshot
            (metrics / name).write_text(kept_text(body), encoding="utf-8", errors="replace")
        (work / "screen.svg").write_text(xml_safe(files.screenshot_svg), encoding="utf-8")
        os.chmod(work, 0o755)  # mkdtemp makes it private; the snapshot is meant to be shared
        os.replace(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final
