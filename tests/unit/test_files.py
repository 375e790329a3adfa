"""The one way kvtop opens a file from outside: regular files only, never waiting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtop.files import UnreadableFile, open_regular, read_regular


def test_a_regular_file_and_a_link_to_one_are_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert read_regular(tmp_path / "f", 3) == read_regular(tmp_path / "link", 3) == b"abc"
    with open_regular(tmp_path / "f") as file:
        assert file.peek(1)[:1] == b"a"


@pytest.mark.parametrize("kind", ["fifo", "dir", "device"])
def test_anything_else_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    with pytest.raises(UnreadableFile, match="not a regular file") as refused:
        read_regular(path, 10)
    assert not refused.value.missing


def test_a_file_over_the_cap_or_missing_says_so(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 2049)
    with pytest.raises(UnreadableFile, match="larger than 2 KiB"):
        read_regular(tmp_path / "f", 2048)
    assert read_regular(tmp_path / "f", 2049) == b"x" * 2049
    with pytest.raises(UnreadableFile) as missing:
        read_regular(tmp_path / "none", 10)
    assert missing.value.missing
    with pytest.raises(UnreadableFile):
        read_regular("a\0b", 10)
