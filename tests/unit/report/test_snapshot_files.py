"""Where `s` writes: the XDG state directory by default (never the directory kvtop was
started in), made private when missing; the path it returns is absolute."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kvtop.report.snapshot_files import (
    SnapshotFiles,
    body_names,
    default_snapshot_dir,
    safe_name,
    write_snapshot,
    xml_safe,
)

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


@pytest.mark.parametrize(("label", "name"), [
    ("gpu-7:8000/metrics", "gpu-7_8000_metrics"), ("Pod.A b  c", "Pod.A_b_c"),
    ("X1", "X1"), ("..__a.b__..", "a.b"), ("", "target"), ("://", "target"),
    ("é" * 3, "target"), ("h" * 200, "h" * 80)])
def test_a_label_becomes_a_short_file_name_safe_name(label: str, name: str) -> None:
    assert safe_name(label) == name


def test_every_label_gets_its_own_name_whatever_the_case() -> None:
    assert body_names(["a/b", "a_b", "A_B", "x", "a/b", "X"]) == [
        "a_b.txt", "a_b-2.txt", "A_B-3.txt", "x.txt", "a_b-4.txt", "X-2.txt"]


def test_characters_xml_forbids_are_replaced_and_the_rest_kept() -> None:
    kept = "\t\n\r \ud7ff\ue000\ufffd\U00010000\U0010ffff<svg>█"
    assert xml_safe(kept) == kept
    assert xml_safe("a\x00b\x1b\x7f\ud800\ufffe\uffff") == "a\ufffdb\ufffd\x7f\ufffd\ufffd\ufffd"


def test_a_snapshot_is_written_whole_under_a_hidden_name_then_renamed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renamed: list[tuple[Path, Path]] = []
    replace = os.replace

    def watched(src: str | Path, dst: str | Path) -> None:
        renamed.append((Path(src), Path(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", watched)
    when = datetime(2026, 7, 1, 12, 0, 0, tzinfo=timezone.utc)
    files = SnapshotFiles(when, {"taken_at": when, "n": 1},
                          [("h:1", "vllm:x 1\n"), ("h/1", "lone \ud800\n")], "<svg>\x00█</svg>")
    path = write_snapshot(tmp_path, files)
    assert path == tmp_path / "kvtop-snapshot-20260701T120000Z"
    [(src, dst)] = renamed
    assert dst == path and src.parent == tmp_path
    assert src.name.startswith(".kvtop-snapshot-20260701T120000Z.")
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*")) == [
        "kvtop-snapshot-20260701T120000Z.json", "metrics", "metrics/h_1-2.txt",
        "metrics/h_1.txt", "screen.svg"]
    assert (path / "kvtop-snapshot-20260701T120000Z.json").read_text(encoding="utf-8") == (
        '{\n  "taken_at": "2026-07-01 12:00:00+00:00",\n  "n": 1\n}\n')
    assert (path / "metrics/h_1.txt").read_bytes() == b"vllm:x 1\n"
    assert (path / "metrics/h_1-2.txt").read_bytes() == b"lone ?\n"
    assert (path / "screen.svg").read_text(encoding="utf-8") == "<svg>\ufffd█</svg>"
    assert path.stat().st_mode & 0o777 == 0o755


def test_snapshots_within_one_second_are_numbered(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    paths = [write_snapshot(None, FILES) for _ in range(3)]  # the default folder made once
    assert [p.name for p in paths] == ["kvtop-snapshot-20260101T000000Z",
                                       "kvtop-snapshot-20260101T000000Z-2",
                                       "kvtop-snapshot-20260101T000000Z-3"]


def test_a_failed_snapshot_leaves_nothing_and_says_why(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def full(src: str | Path, dst: str | Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left on device"):
        write_snapshot(tmp_path, FILES)
    assert list(tmp_path.iterdir()) == []
