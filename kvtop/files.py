"""The one way kvtop opens a file it reads from outside (a recording, a baseline, a config, a
token file): a regular file only. A FIFO would block the read for good (``baseline list``
hung on a ``*.json`` FIFO), a device such as ``/dev/zero`` would never end; the path is
followed as the operator wrote it (a symlink to a regular file is read), and the open never
waits (``O_NONBLOCK``) so the check comes before any read.
"""

from __future__ import annotations

import os
import stat
from io import BufferedReader
from pathlib import Path


class UnreadableFile(Exception):
    """Why a file can't be read, without its path (the caller names it); ``missing`` when
    there is no file there at all."""

    def __init__(self, reason: str, *, missing: bool = False) -> None:
        super().__init__(reason)
        self.missing = missing


def open_regular(path: str | Path) -> BufferedReader:
    """``path`` opened for reading (buffered, binary), if it is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # not inherited (PEP 446)
    except FileNotFoundError as exc:
        raise UnreadableFile(exc.strerror or "no such file", missing=True) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise UnreadableFile(getattr(exc, "strerror", None) or str(exc)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableFile("not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The whole of a regular file of at most ``max_bytes``; past it, UnreadableFile."""
    with open_regular(path) as file:
        try:
            data = file.read(max_bytes + 1)
        except OSError as exc:
            raise UnreadableFile(exc.strerror or str(exc)) from None
    if len(data) > max_bytes:
        raise UnreadableFile(f"larger than {_size(max_bytes)}")
    return data


def _size(n: int) -> str:
    if n >= 2**20 and n % 2**20 == 0:
        return f"{n // 2**20} MiB"
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n:,} bytes"
