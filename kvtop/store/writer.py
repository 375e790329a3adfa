"""Writing a recording so that no failure leaves a file a reader can't use.

* The file is new: created with ``O_EXCL | O_NOFOLLOW``, so an existing file is never
  truncated and a symbolic link never followed. ``replace=True`` (``kvtop record --force``)
  writes a new file beside it and renames it over the name: the old file (or the link)
  goes, and nothing it pointed to is touched.
* Lines wait in memory and go to disk at ``flush()`` (or once ``FLUSH_BYTES`` wait), all of
  them or none: a failed write (a full disk) is cut back off the file, counted in ``lost``
  and reported by the caller, and the next flush tries again. The file on disk is always
  whole lines; gzip goes in sync-flushed pieces of one stream whose compressor is rolled
  back with the file, so it stays valid too.
* ``max_bytes`` caps the file: the batch that would cross it is not written, the file is
  finished (a complete gzip) and closed, and ``full`` is set.

Write errors never raise from ``write``/``flush``/``close``: monitoring goes on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import struct
import time
import zlib
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvtop.collect.kv_events import KvEventBatch
from kvtop.collect.target import Scrape, Target
from kvtop.safe_text import json_text
from kvtop.store.format import MAX_LINE_BYTES, MiB, header_line, kv_events_line, scrape_line

DEFAULT_MAX_BYTES = 1024 * MiB
MIN_MAX_BYTES = MiB  # a smaller limit would stop before a single large scrape
FLUSH_BYTES = MiB  # lines buffered beyond this go to disk without waiting for flush()
GZIP_LEVEL = 6  # 4 % bigger than 9 on a vLLM scrape, at half the CPU
_GZIP_END_BYTES = 16  # the final deflate block and the trailer, kept free under max_bytes
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class RecordingExists(FileExistsError):
    """The recording's path is taken (a file, a link, anything): kvtop does not overwrite."""


def _nothing() -> None:
    """Nothing to put back: plain text holds no state between pieces."""


class _Plain:
    def start(self) -> bytes:
        return b""

    def encode(self, data: bytes) -> bytes:
        return data

    def checkpoint(self) -> Callable[[], None]:
        return _nothing

    def end(self) -> bytes:
        return b""


class _Gzip:
    """One gzip member written in sync-flushed pieces: after each piece the bytes on disk
    decompress to exactly the lines written so far. A piece that did not reach the disk is
    taken back out of the compressor (``checkpoint``), so the stream stays valid."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._crc = 0
        self._size = 0

    def start(self) -> bytes:
        return b"\x1f\x8b\x08\x00" + struct.pack("<I", int(time.time())) + b"\x00\xff"

    def encode(self, data: bytes) -> bytes:
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        return self._deflate.compress(data) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def checkpoint(self) -> Callable[[], None]:
        """What puts the compressor back as it is now."""
        deflate, crc, size = self._deflate.copy(), self._crc, self._size

        def restore() -> None:
            self._deflate, self._crc, self._size = deflate, crc, size
        return restore

    def end(self) -> bytes:
        return self._deflate.flush(zlib.Z_FINISH) + struct.pack(
            "<II", self._crc, self._size & 0xFFFFFFFF)


def _encode(line: dict[str, Any]) -> bytes:
    return (json_text(line, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        offset += (written := os.pwrite(fd, view, offset))
        view = view[written:]


def _create(path: Path, replace: bool, first: bytes) -> int:
    """A new file at ``path`` holding ``first``; never writes through an existing name."""
    if not replace:
        try:
            fd = os.open(path, _CREATE, 0o666)
        except FileExistsError:
            what = "a symbolic link" if path.is_symlink() else "an existing file"
            raise RecordingExists(errno.EEXIST, f"it is {what}, and kvtop does not "
                                                "overwrite or follow one") from None
        return _fill(fd, first, path)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = _fill(os.open(temp, _CREATE, 0o666), first, temp)
    try:
        os.replace(temp, path)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return fd


def _fill(fd: int, first: bytes, path: Path) -> int:
    try:
        _write_all(fd, first, 0)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return fd


class RecordingWriter:
    """Appends scrapes to a new recording; usable as a context manager."""

    def __init__(self, path: Path, *, interval_s: float, targets: list[Target],
                 max_bytes: int | None = DEFAULT_MAX_BYTES, replace: bool = False) -> None:
        self.path = path
        self.max_bytes = max_bytes or None
        self.written = 0  # lines on disk after the header: scrapes and KV event batches
        self.kv_written = 0  # ... of which KV event batches
        self.lost = 0  # scrapes a write error kept off the disk
        self.unrecorded = 0  # scrapes that came after the file reached max_bytes
        self.error: str | None = None  # the last write error
        self.failing = False  # the last write failed
        self.full = False  # max_bytes reached: the file is finished and closed
        self.end_lost = False  # the gzip end could not be written
        self._codec = _Gzip() if path.name.endswith(".gz") else _Plain()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_kv = 0
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        first = self._codec.start() + self._codec.encode(
            _encode(header_line(interval_s, [t.url for t in targets], created)))
        self._fd: int | None = _create(path, replace, first)
        self._size = len(first)  # bytes on disk, every one of them part of a whole line

    def write(self, scrape: Scrape) -> None:
        if self._fd is None:
            if self.full:
                self.unrecorded += 1
            return
        data = _encode(scrape_line(scrape))
        if len(data) > MAX_LINE_BYTES:  # readers skip such a line: say why instead
            data = _encode({"t": scrape.t, "target": scrape.target.url, "failure": "bad_payload",
                            "error": f"a body of {len(data)} bytes is too large to record"})
        self._add(data)

    def write_kv_events(self, batch: KvEventBatch, target: Target) -> None:
        """One KV event batch of ``target`` (counted with the scrapes: written, lost…)."""
        if self._fd is None:
            if self.full:
                self.unrecorded += 1
            return
        self._pending_kv += 1
        self._add(_encode(kv_events_line(batch, target.url)))

    def _add(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Everything written so far to disk, or (on a write error) counted in ``lost``."""
        if not self._pending or self._fd is None:
            return
        count, batch, kv = len(self._pending), b"".join(self._pending), self._pending_kv
        self._pending.clear()
        self._pending_bytes = self._pending_kv = 0
        undo = self._codec.checkpoint()
        data = self._codec.encode(batch)
        if self.max_bytes is not None and (
                self._size + len(data) + _GZIP_END_BYTES > self.max_bytes):
            undo()
            self.unrecorded += count
            self.full = True
            self._finish()
            return
        try:
            _write_all(self._fd, data, self._size)
        except OSError as exc:
            undo()
            self._failed(exc)
            self.lost += count
            return
        self._size += len(data)
        self.written += count
        self.kv_written += kv
        self.failing = False

    def _failed(self, exc: OSError) -> None:
        """Cut off whatever part of the failed write reached the file."""
        assert self._fd is not None
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self._size)
        self.error = exc.strerror or str(exc)
        self.failing = True

    def _finish(self) -> None:
        if self._fd is None:
            return
        try:
            end = self._codec.end()
            _write_all(self._fd, end, self._size)
            self._size += len(end)
        except OSError as exc:  # the file still reads to its last line, with a warning
            self._failed(exc)
            self.end_lost = True
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None

    def close(self) -> None:
        self.flush()
        self._finish()

    def status(self) -> str | None:
        """What went wrong, in a few words for a status line; None while all is well."""
        parts = []
        if self.lost:
            parts.append(f"{self.lost} lost ({self.error})")
        if self.full:
            parts.append(f"stopped at {size_text(self.max_bytes or 0)}")
        if self.end_lost:
            parts.append(f"end not written ({self.error})")
        return ", ".join(parts) or None

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB, "t": 1024 * 1024 * MiB}


def parse_size(text: str) -> int:
    """``500M``, ``1G``, ``2GiB``, ``64k`` or a byte count (powers of 1024); ``0`` or
    ``none`` for no limit (returned as 0)."""
    if text.strip().lower() in ("0", "none"):
        return 0
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size (500M, 1G, 0 for no limit)")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size < MIN_MAX_BYTES:
        raise ValueError(f"{text!r} is under the least a recording may be "
                         f"({size_text(MIN_MAX_BYTES)}; 0 for no limit)")
    return size


def size_text(size: int) -> str:
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024)):
        if size >= factor:
            return f"{size / factor:.3g} {unit}"
    return f"{size} B"
