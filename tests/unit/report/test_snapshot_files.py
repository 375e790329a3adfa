"""Where `s` writes: the XDG state directory by default (never the directory kvtop was
started in), made private when missing; the path it returns is absolute."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kvtop.report.snapshot_files import SnapshotFiles, default_snapshot_dir, write_snapshot

FILES = SnapshotFiles(datetime(2026, 1, 1, tzinfo=timezone.utc), {"kvtop_snapshot": 1},
                      [("h:1", "vllm:x 1\n")], "<svg/>")


def test_the_default_is_the_xdg_state_directory() -> None:
    home = Path.home()
    assert default_snapshot_dir({"XDG_STATE_HOME": "/s"}) == Path("/s/kvtop/snapshots")
    for unusable in ({}, {"XDG_STATE_HOME": ""}, {"XDG_STATE_HOME": "rel/state"}):
        # unset, empty or relative (which the XDG spec says to ignore): ~/.local/state
        assert default_snapshot_dir(unusable) == home / ".local/state/kvtop/snapshots"


def test_the_default_folder_is_made_private_and_the_path_said_is_absolute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    path = write_snapshot(None, FILES)
    assert path == tmp_path / "state/kvtop/snapshots/kvtop-snapshot-20260101T000000Z"
    assert (path / "metrics" / "h_1.txt").read_text() == "vllm:x 1\n"
    assert (tmp_path / "state/kvtop/snapshots").stat().st_mode & 0o777 == 0o700
    assert [p.name for p in tmp_path.iterdir()] == ["state"]  # nothing where kvtop started
    # --snapshot-dir as given, relative or not: the path said is absolute
    (tmp_path / "here").mkdir()
    said = write_snapshot(Path("here"), FILES)
    assert said.is_absolute() and said.parent == tmp_path / "here"
    assert os.path.isdir(said)
