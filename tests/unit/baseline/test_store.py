"""Where baselines live and how they are read: a regular file only, bounded in size and in
the values it may hold before it is parsed; names and paths; saved atomically, listed,
removed, and every failure a BaselineError that names the file."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from kvtop.baseline import store
from kvtop.baseline.model import Baseline, BaselineError, EngineSummary, Figure, TargetSummary


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    path = store.baselines_dir()
    path.mkdir(parents=True)
    return path


def test_a_fifo_is_refused_at_once_not_waited_on(folder: Path) -> None:
    """A FIFO given as a baseline, or a *.json FIFO in the folder, blocked show and list."""
    os.mkfifo(folder / "stuck.json")
    started = time.monotonic()
    with pytest.raises(BaselineError, match="not a regular file"):
        store.load(str(folder / "stuck.json"))
    [listed] = store.list_saved()
    assert listed.baseline is None and "not a regular file" in (listed.error or "")
    assert time.monotonic() - started < 5


def test_a_missing_baseline_says_where_it_looked(folder: Path) -> None:
    with pytest.raises(BaselineError, match=r"no baseline 'gone' at .*gone\.json .*list shows"):
        store.load("gone")


def test_a_baseline_of_too_many_values_is_refused_before_it_is_parsed(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "MAX_VALUES", 1000)
    (folder / "many.json").write_text("[" + "1," * 999 + "1]")  # exactly at the bound
    with pytest.raises(BaselineError, match="not a kvtop baseline \\(no"):  # parsed: not one
        store.load("many")
    (folder / "many.json").write_text("[" + "1," * 1000 + "1]")  # one more
    with pytest.raises(BaselineError, match="over 1,000 values"):
        store.load("many")


def test_a_baseline_over_the_size_cap_is_refused(folder: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "MAX_BYTES", 100)
    (folder / "big.json").write_text(" " * 101)
    with pytest.raises(BaselineError, match="larger than 100 bytes, not a kvtop baseline"):
        store.load("big")


def small(name: str | None = "small") -> Baseline:
    return Baseline(name, "2026-12-05T00:00:00+00:00", "1.0", {"kind": "live"}, 10.0, 600.0,
                    60.0, targets=[TargetSummary("http://127.0.0.1:8000/metrics")])


def test_baselines_live_under_xdg_data_home_else_the_home_folder(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert store.baselines_dir() == tmp_path / "kvtop" / "baselines"
    monkeypatch.setenv("XDG_DATA_HOME", "")  # set but empty: the default, as the spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder = tmp_path / "home" / ".local/share/kvtop/baselines"
    assert store.baselines_dir() == folder
    assert store.baseline_path("a.b_c-1") == folder / "a.b_c-1.json"


@pytest.mark.parametrize(("spec", "is_path"), [
    ("name", False), ("a.json", True), ("dir/name", True), ("./name", True),
    ("name.json5", False), ("~/b.json", True)])
def test_a_spec_with_a_folder_or_a_json_suffix_is_a_path(spec: str, is_path: bool) -> None:
    assert store.is_path(spec) is is_path


def test_a_path_is_taken_as_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert store.baseline_path("~/b.json") == tmp_path / "b.json"
    assert store.baseline_path("rel/b") == Path("rel/b")


@pytest.mark.parametrize("name", ["a b", "-x", ".x", "x" * 101, "a:b", ""])
def test_names_that_are_not_names(name: str) -> None:
    with pytest.raises(BaselineError, match=f"^{re.escape(repr(name))} is not a baseline "
                       r"name \(letters, digits, '\.', '_', '-'; up to 100\) nor a path"):
        store.baseline_path(name)
    assert store.exists(name) is False


def test_the_longest_name_is_a_name(folder: Path) -> None:
    assert store.baseline_path("x" * 100) == folder / f"{'x' * 100}.json"


def test_save_list_load_remove(folder: Path) -> None:
    path = store.save(small(), "one")
    assert path == folder / "one.json" and path.read_text() == small().dumps()
    assert store.exists("one") and not store.exists("two")
    with pytest.raises(FileExistsError, match=r"^baseline 'one' exists \(.*one\.json\); "
                       "--force replaces it$"):
        store.save(small("other"), "one")
    assert store.load("one").name == "small"
    store.save(small("other"), "one", overwrite=True)
    assert store.load("one").name == "other"
    (folder / "broken.json").write_text('{"format": "kvtop-baseline", "vers')
    (folder / "notes.txt").write_text("not a baseline")
    listed = store.list_saved()
    assert [(e.name, e.path) for e in listed] == [("broken", folder / "broken.json"),
                                                  ("one", folder / "one.json")]
    assert listed[0].baseline is None and listed[0].error is not None
    assert listed[0].error.startswith(f"{folder / 'broken.json'}: not a complete JSON")
    assert listed[1].baseline is not None and listed[1].error is None
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no temp left
    assert store.remove("one") == folder / "one.json" and not store.exists("one")
    with pytest.raises(BaselineError, match=r"^no baseline 'one' at .*one\.json$"):
        store.remove("one")


def test_saving_makes_the_folder_and_nothing_is_listed_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "new"))
    assert store.list_saved() == []
    store.save(small(), "first")
    assert (tmp_path / "new/kvtop/baselines/first.json").is_file()


def test_a_path_is_saved_and_loaded_as_given(tmp_path: Path) -> None:
    path = store.save(small(), str(tmp_path / "here.json"))
    assert path == tmp_path / "here.json" and store.load(str(path)).name == "small"
    gone = re.escape(str(tmp_path / "gone.json"))
    with pytest.raises(BaselineError, match=f"^no baseline '{gone}' at {gone}$"):
        store.load(str(tmp_path / "gone.json"))  # a path: no hint of the list


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
        small_disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk (a real 512 KiB filesystem) halfway through a baseline of a million
    values: the old one stays whole, no temporary file is left."""
    monkeypatch.setenv("XDG_DATA_HOME", str(small_disk))
    path = store.save(small(), "kept")
    before = path.read_text()
    big = small("big")
    big.targets[0].engines.append(EngineSummary(
        "m", "0", figures={"kv_usage": Figure(0.5, (0.5,) * 1_000_000)}))
    with pytest.raises(OSError, match="No space left"):
        store.save(big, "kept", overwrite=True)
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["kept.json"]


def test_what_is_not_a_baseline_is_refused_with_its_path(folder: Path) -> None:
    (folder / "bytes.json").write_bytes(b'{"name": "\xff"}')
    with pytest.raises(BaselineError, match=r"^.*bytes\.json: not UTF-8 text, not a kvtop "
                       "baseline$"):
        store.load("bytes")
    (folder / "other.json").write_text('{"format": "something"}')
    with pytest.raises(BaselineError, match=r"^.*other\.json: not a kvtop baseline \(no"):
        store.load("other")
    (folder / "dir.json").mkdir()
    with pytest.raises(BaselineError, match=r"^.*dir\.json: .*, not a kvtop baseline$"):
        store.load("dir")


def test_a_baseline_that_cannot_be_removed_says_why(folder: Path) -> None:
    (folder / "dir.json").mkdir()
    with pytest.raises(BaselineError, match=r"^.*dir\.json: Is a directory$"):
        store.remove("dir")
