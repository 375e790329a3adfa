"""Real filesystems that refuse a write: a 512 KiB tmpfs to fill, a read-only one, and
this process's own file-size limit."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at the existing ``folder`` (root only), unmounted after."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                   check=True, capture_output=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@contextmanager
def small_tmpfs(folder: Path) -> Iterator[Path]:
    """Mount a 512 KiB tmpfs at ``folder``; only root may, so others get a skip."""
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a small tmpfs, and only root can mount one "
                    "(CI runs as root)")
    folder.mkdir()
    with tmpfs(folder, "size=512k"):
        yield folder


def fill(folder: Path) -> Path:
    """Take every free byte of the filesystem; delete the file returned to free them."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (b"x" * 65536, b"x"):
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC  # the disk is full
    finally:
        os.close(fd)
    return filler


@contextmanager
def refused_writes_past(size: int) -> Iterator[None]:
    """Writes that would take a file of this process past ``size`` bytes fail (EFBIG), as
    on a full disk; Python ignores the SIGXFSZ the kernel sends with them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
