"""The recording format's names and limits, shared by the writer and the reader
(docs/recording-format.md says what each means to someone writing or reading a file)."""

from __future__ import annotations

from typing import Any

from kvtop.collect.target import Scrape

FORMAT, VERSION = "kvtop-recording", 1
FAILURES: frozenset[str] = frozenset({"down", "timeout", "auth", "bad_payload"})

MiB = 1024 * 1024
# What a reader accepts. Anything beyond is a skipped line (or, in the header, an error):
# a recording may come from anywhere, and replaying it must not take the machine down.
MAX_LINE_BYTES = 24 * MiB  # a 16 MiB body (the poller's cap) JSON-escaped fits
MAX_TARGETS = 10_000
MAX_URL_CHARS = 4096
MAX_T = 1e10  # unix seconds, before the year 2286: a clock can show it
MAX_INTERVAL_S = 86_400.0
MAX_LATE_S = 600.0  # how far a line's t may lag behind an earlier line's (a slow scrape)
MAX_ERROR_CHARS = 2000
MAX_VERSION_CHARS = 200


class RecordingError(ValueError):
    """A file that is not a readable kvtop recording; the message says why."""


def header_line(interval_s: float, targets: list[str], created: str) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "created": created,
            "interval_s": interval_s, "targets": targets}


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
