"""The kvtop recording format, version 1 (a public contract: docs/recording-format.md).

JSON Lines, gzip-compressed when the file name ends in ``.gz``. Line 1 is the header::

    {"format": "kvtop-recording", "version": 1, "created": "<ISO-8601>",
     "interval_s": <float>, "targets": [<str>...]}

then one line per scrape, ``{"t": <unix s>, "target": <url>, "body": "<text>"}`` or
``{"t": ..., "target": ..., "error": "<why>"}``, and (``"kind": "kv_events"``) one per KV
event batch. Other line kinds may be added (they carry a ``"kind"`` key); readers ignore
keys and kinds they do not know.

The names live in :mod:`kvtop.store.format`, writing in :mod:`kvtop.store.writer` (a full
disk, a size limit, never over an existing file) and reading in :mod:`kvtop.store.reader`
(every line checked, the file streamed); this module is where the rest of kvtop imports
them from.
"""

from __future__ import annotations

from kvtop.collect.kv_endpoint import TargetKvEvents
from kvtop.store.format import (
    FAILURES,
    FORMAT,
    VERSION,
    RecordingError,
    kv_events_line,
    scrape_line,
)
from kvtop.store.reader import Recording, RecordingFile, open_recording, read_recording
from kvtop.store.writer import (
    DEFAULT_MAX_BYTES,
    RecordingExists,
    RecordingWriter,
    parse_size,
    size_text,
)

__all__ = [
    "DEFAULT_MAX_BYTES", "FAILURES", "FORMAT", "VERSION", "Recording", "RecordingError",
    "RecordingExists", "RecordingFile", "RecordingWriter", "TargetKvEvents", "kv_events_line",
    "open_recording", "parse_size", "read_recording", "scrape_line", "size_text",
]
