"""The kvtop recording format, version 1 (a public contract: docs/recording-format.md).

JSON Lines, gzip-compressed when the file name ends in ``.gz``. Line 1 is the header::

    {"format": "kvtop-recording", "version": 1, "created": "<ISO-8601>",
     "interval_s": <float>, "targets": [<str>...]}

then one line per scrape, ``{"t": <unix s>, "target": <url>, "body": "<text>"}`` or
``{"t": ..., "target": ..., "error": "<why>"}``. Other line kinds may be added (they carry a
``"kind"`` key); readers ignore keys and kinds they do not know.
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from kvtop.collect.target import FailureKind, Scrape, Target

FORMAT, VERSION = "kvtop-recording", 1
FAILURES: frozenset[str] = frozenset({"down", "timeout", "auth", "bad_payload"})


class RecordingError(ValueError):
    """A file that is not a readable kvtop recording; the message says why."""


def _open(path: Path, mode: str) -> IO[str]:
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


def scrape_line(scrape: Scrape) -> dict[str, Any]:
    """A scrape as a recording line. Only the URL is written: never a token."""
    line: dict[str, Any] = {"t": scrape.t, "target": scrape.target.url}
    if scrape.ok:
        line["body"] = scrape.text()
    else:
        line["error"] = scrape.error or "failed"
        line["failure"] = scrape.failure or "down"
    if scrape.version:
        line["version"] = scrape.version
    return line


class RecordingWriter:
    """Appends scrapes to a new recording; usable as a context manager."""

    def __init__(self, path: Path, *, interval_s: float, targets: list[Target]) -> None:
        self.path = path
        self._file = _open(path, "w")
        self._write({"format": FORMAT, "version": VERSION,
                     "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "interval_s": interval_s, "targets": [t.url for t in targets]})

    def _write(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")

    def write(self, scrape: Scrape) -> None:
        self._write(scrape_line(scrape))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(slots=True)
class Recording:
    """A recording read back: its header and scrapes in file order."""

    header: dict[str, Any]
    scrapes: list[Scrape] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def interval_s(self) -> float:
        return float(self.header.get("interval_s") or 1.0)

    def targets(self) -> list[Target]:
        urls = list(self.header.get("targets") or [])
        urls += [s.target.url for s in self.scrapes if s.target.url not in urls]
        return [Target(url=url) for url in dict.fromkeys(urls)]


def _scrape_from(line: dict[str, Any], targets: dict[str, Target]) -> Scrape | None:
    url, t = line.get("target"), line.get("t")
    if not isinstance(url, str) or not isinstance(t, (int, float)):
        return None
    target = targets.setdefault(url, Target(url=url))
    version = line.get("version") if isinstance(line.get("version"), str) else None
    if isinstance(line.get("body"), str):
        return Scrape(target, float(t), body=line["body"], version=version)
    if "error" in line:
        failure: FailureKind = line.get("failure") if line.get("failure") in FAILURES else "down"
        return Scrape(target, float(t), failure=failure, error=str(line["error"]),
                      version=version)
    return None


_UNREADABLE = (EOFError, gzip.BadGzipFile, OSError, UnicodeDecodeError)


def read_recording(path: Path) -> Recording:
    """Read a whole recording. A cut-off tail (a crash mid-write) is a warning, not an error."""
    try:
        file = _open(path, "r")
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror or exc}") from None
    recording: Recording | None = None
    targets: dict[str, Target] = {}
    with file:
        try:
            for number, text in enumerate(file, 1):
                recording = _take_line(recording, number, text, targets, path)
        except _UNREADABLE as exc:
            if recording is None:
                raise RecordingError(f"{path}: unreadable ({exc})") from None
            recording.warnings.append(f"the file ends early ({exc}); read what was there")
    if recording is None:
        raise RecordingError(f"{path}: empty file, not a kvtop recording")
    return recording


def _take_line(recording: Recording | None, number: int, text: str,
               targets: dict[str, Target], path: Path) -> Recording:
    try:
        line = json.loads(text)
    except ValueError:
        if recording is None:
            raise RecordingError(f"{path}: not a kvtop recording (line 1 is not JSON)") from None
        recording.warnings.append(f"line {number}: not JSON (cut off?), skipped")
        return recording
    if recording is None:
        return Recording(_header(line, path))
    scrape = _scrape_from(line, targets) if isinstance(line, dict) else None
    if scrape is not None:
        recording.scrapes.append(scrape)
    return recording


def _header(line: Any, path: Path) -> dict[str, Any]:
    if not isinstance(line, dict) or line.get("format") != FORMAT:
        raise RecordingError(f"{path}: not a kvtop recording (no {FORMAT!r} header)")
    if not isinstance(line.get("version"), int) or line["version"] > VERSION:
        raise RecordingError(f"{path}: recording version {line.get('version')!r} is newer "
                             f"than this kvtop reads ({VERSION}); upgrade kvtop")
    return line
