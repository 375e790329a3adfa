"""The one way kvtop opens a file from outside: regular files only, never waiting."""

from __future__ import annotations

import os
import tracemalloc
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
    with pytest.raises(UnreadableFile) as refused:
        read_regular(path, 10)
    assert str(refused.value) == "not a regular file"
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


@pytest.mark.parametrize(("cap", "said"), [
    (0, "0 bytes"), (3, "3 bytes"), (1023, "1,023 bytes"), (1024, "1 KiB"), (1025, "1,025 bytes"),
    (2**20 - 1024, "1023 KiB"), (2**20, "1 MiB"), (2**20 + 1024, "1025 KiB"),
    (2**20 + 1, "1,048,577 bytes"), (3 * 2**20, "3 MiB")])
def test_the_cap_is_said_in_the_largest_unit_it_is_a_whole_number_of(
        tmp_path: Path, cap: int, said: str) -> None:
    (tmp_path / "f").write_bytes(b"x" * (cap + 1))
    with pytest.raises(UnreadableFile) as refused:
        read_regular(tmp_path / "f", cap)
    assert str(refused.value) == f"larger than {said}"


def test_why_a_path_cannot_be_opened_is_the_systems_reason_without_the_path(
        tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(UnreadableFile) as not_a_dir:
        read_regular(tmp_path / "file" / "inside", 10)
    assert str(not_a_dir.value) == "Not a directory"
    assert not not_a_dir.value.missing
    with pytest.raises(UnreadableFile) as nul:
        read_regular("a\0b", 10)
    assert str(nul.value) == "embedded null byte"
    with pytest.raises(UnreadableFile) as missing:
        read_regular(tmp_path / "none", 10)
    assert str(missing.value) == "No such file or directory"


def test_an_open_file_is_not_inherited_by_child_processes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with open_regular(tmp_path / "f") as file:
        assert not os.get_inheritable(file.fileno())


def test_a_read_that_fails_says_the_systems_reason() -> None:
    with pytest.raises(UnreadableFile) as failed:  # a regular file whose offset 0 is unmapped
        read_regular("/proc/self/mem", 10)
    assert str(failed.value) == "Input/output error"


def test_a_file_past_the_cap_is_not_read_whole(tmp_path: Path) -> None:
    with open(tmp_path / "sparse", "wb") as file:
        file.truncate(64 * 2**20)
    tracemalloc.start()
    try:
        with pytest.raises(UnreadableFile):
            read_regular(tmp_path / "sparse", 1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20
