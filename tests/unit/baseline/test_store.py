"""Where baselines live and how they are read: a regular file only, bounded in size and in
the values it may hold before it is parsed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kvtop.baseline import store
from kvtop.baseline.model import BaselineError


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
