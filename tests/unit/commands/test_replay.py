"""`kvtop replay` run through kvtop's own command line in this process (so the mutation runs
see it): its options and their defaults, the refusal of a stdout that is not a terminal, a
baseline that cannot be read, a recording that cannot be replayed, and what the app it opens
is given (speed, snapshot folder, baseline).

The terminal is a real pseudo-terminal put in place of stdout; the app itself runs headless
under Textual's own Pilot (Textual's ``App.run`` is pointed at its headless mode with an
auto-pilot), so the test can look at it and press its keys, then quit it with q."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from textual.app import App
from textual.pilot import Pilot

from kvtop.cli import build_command_parser, main
from kvtop.commands import replay
from kvtop.exits import EXIT_NO_DATA, EXIT_OK, EXIT_USAGE
from kvtop.store.recording import RecordingWriter
from kvtop.ui.keys import REPLAY_BINDINGS
from kvtop.ui.replay import ReplayApp
from tests.scenarios.app import HOST_A, until, write_recording
from tests.support.waiting import eventually

REFUSED = ("kvtop replay: the app draws on a terminal, and stdout is not one; for a pipe or a "
           "file use `kvtop check --replay FILE` (a verdict) or `kvtop snapshot` on a live "
           "target\n")


@contextmanager
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """stdout on a real pseudo-terminal, as when a person runs kvtop replay (set in the
    test's body: the capture puts its own stdout back before each test phase)."""
    main_side, side = os.openpty()
    try:
        with open(side, "w") as tty, monkeypatch.context() as patch:
            patch.setattr(sys, "stdout", tty)
            yield
    finally:
        os.close(main_side)


Look = Callable[[ReplayApp, Pilot], Awaitable[None]]


@pytest.fixture
def headless(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[Look], list[ReplayApp]]:
    """Run the app the command opens headless, ``look`` at it under Pilot, then press q.
    Returns the apps that ran. Snapshots without a folder would go under the test's own
    XDG_STATE_HOME."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def drive(look: Look) -> list[ReplayApp]:
        ran: list[ReplayApp] = []
        run = App.run

        def headless_run(app: App[object], **_: object) -> object:
            assert isinstance(app, ReplayApp)
            ran.append(app)

            async def pilot(driver: Pilot) -> None:
                await look(app, driver)
                await driver.press("q")

            return run(app, headless=True, size=(120, 30), auto_pilot=pilot)

        monkeypatch.setattr(App, "run", headless_run)
        return ran
    return drive


def bar(app: ReplayApp) -> str:
    return str(app.query_one("#replay").render())


async def snapshot_folder(app: ReplayApp, pilot: Pilot) -> Path:
    """Press s; the folder the app says it wrote the replayed moment's snapshot to."""
    await pilot.press("s")
    [told] = await eventually(
        lambda: [n.message for n in app._notifications if n.message.startswith("Snapshot")],
        "the snapshot written (in a thread) and told", pause=pilot.pause)
    assert re.fullmatch(r"Snapshot saved to .*/kvtop-snapshot-20260101T\d{6}Z", told), told
    return Path(told.removeprefix("Snapshot saved to ")).parent


# -- the options ----------------------------------------------------------------------------


def test_the_options_default_to_real_time_and_the_current_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = build_command_parser().parse_args(["replay", "rec.jsonl.gz"])
    assert (args.command, args.recording, args.speed, args.snapshot_dir, args.baseline) == (
        replay.run, Path("rec.jsonl.gz"), 1.0, tmp_path, None)
    args = build_command_parser().parse_args(
        ["replay", "r.jsonl", "--speed", "0.5", "--snapshot-dir", "snaps", "--baseline", "b"])
    assert (args.recording, args.speed, args.snapshot_dir, args.baseline) == (
        Path("r.jsonl"), 0.5, Path("snaps"), "b")


@pytest.mark.parametrize("speed", ["0", "-1", "nan", "inf", "fast"])
def test_a_speed_that_is_not_a_positive_number_is_a_usage_error(
        speed: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "r.jsonl", "--speed", speed]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and "argument --speed: " in err and "Traceback" not in err


# -- what is refused before the app starts ---------------------------------------------------


def test_a_stdout_that_is_not_a_terminal_is_refused_before_the_file_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "none.jsonl")]) == EXIT_USAGE
    assert capsys.readouterr() == ("", REFUSED)


def test_a_baseline_that_cannot_be_read_is_named_before_anything_else(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gone = tmp_path / "gone.json"
    assert main(["replay", str(tmp_path / "none.jsonl"), "--baseline", str(gone)]) == EXIT_USAGE
    assert capsys.readouterr() == ("", f"kvtop: baseline: no baseline {str(gone)!r} at {gone}\n")


def test_on_a_terminal_a_missing_recording_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "none.jsonl"
    with terminal(monkeypatch):
        assert main(["replay", str(missing)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"kvtop replay: {missing}: ") and err != REFUSED


def test_on_a_terminal_a_recording_without_scrapes_has_nothing_to_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty.jsonl"
    with RecordingWriter(empty, interval_s=5.0, targets=[HOST_A]):
        pass
    with terminal(monkeypatch):
        assert main(["replay", str(empty)]) == EXIT_NO_DATA
    assert capsys.readouterr().err == f"kvtop replay: {empty} holds no scrapes\n"


# -- the app it opens ------------------------------------------------------------------------


def test_the_app_replays_at_the_speed_given_and_snapshots_where_told(
        tmp_path: Path, headless: Callable[[Look], list[ReplayApp]],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_recording(tmp_path / "rec.jsonl")
    snapshots = tmp_path / "snaps"
    snapshots.mkdir()

    async def look(app: ReplayApp, pilot: Pilot) -> None:
        assert await until(pilot, lambda: "▶ REPLAY ×4 " in bar(app))
        assert app.replay.speed == 4.0 and app.config.baseline is None
        assert await snapshot_folder(app, pilot) == snapshots

    ran = headless(look)
    with terminal(monkeypatch):
        assert main(["replay", str(path), "--speed", "4", "--snapshot-dir", str(snapshots)]) \
            == EXIT_OK
    assert len(ran) == 1 and ran[0].replay_name == "rec.jsonl"
    assert capsys.readouterr().err == ""


def test_the_app_draws_the_baseline_named(
        tmp_path: Path, headless: Callable[[Look], list[ReplayApp]],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default snapshot folder
    path = write_recording(tmp_path / "rec.jsonl")
    saved = tmp_path / "base.json"
    assert main(["baseline", "save", str(saved), "--from", str(path), "--json"]) == EXIT_OK
    capsys.readouterr()

    async def look(app: ReplayApp, pilot: Pilot) -> None:
        assert await until(pilot, lambda: "▶ REPLAY ×1 " in bar(app))
        overlay = app.config.baseline
        assert overlay is not None and overlay.default is not None
        assert (overlay.baselines, overlay.default.name) == ({}, "base")
        assert await snapshot_folder(app, pilot) == tmp_path

    ran = headless(look)
    with terminal(monkeypatch):
        assert main(["replay", str(path), "--baseline", str(saved)]) == EXIT_OK
    assert len(ran) == 1 and capsys.readouterr().err == ""


def test_an_empty_baseline_name_draws_none(
        tmp_path: Path, headless: Callable[[Look], list[ReplayApp]],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--baseline "$BASE"`` with the variable unset: no baseline, as without the option."""
    path = write_recording(tmp_path / "rec.jsonl")

    async def look(app: ReplayApp, pilot: Pilot) -> None:
        assert await until(pilot, lambda: "▶ REPLAY ×1 " in bar(app))
        assert app.config.baseline is None

    ran = headless(look)
    with terminal(monkeypatch):
        assert main(["replay", str(path), "--baseline", ""]) == EXIT_OK
    assert len(ran) == 1 and capsys.readouterr().err == ""


def test_the_replay_help_names_the_keys_the_replay_binds(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Its "Keys:" are the replay footer's, each with its word; it once offered arrows to step
    and + - for speed, the live app's interval keys, which the replay refuses."""
    assert main(["replay", "--help"]) == EXIT_OK
    keys = " ".join(capsys.readouterr().out.split()).split("Keys: ", 1)[1].split(" positional")[0]
    shown = [f"{b.key_display} {b.description.lower()}" for b in REPLAY_BINDINGS if b.show]
    assert shown == ["space pause", ". step", "[ ] seek", "< > speed"]
    assert all(f"{key}, " in keys or f"{key} (" in keys for key in shown), keys
    assert "arrows" not in keys and "+ -" not in keys
