"""The replay app on real recordings (real /metrics bodies written by a real RecordingWriter),
run headless with kvtop's own stylesheet (Pilot): the bar's exact text and style roles in
every state (playing, paused, at the end, played on past it), each replay key with the exact
position it leads to (the first frame, the last, one past), the speed's bounds and message,
the interval keys refused, the search box keeping its `.`, a seek back rebuilding the
trackers, a long catch-up letting the event loop in every YIELD_EVERY scrapes, what
`replay_app` builds from a file (its interval clamped to the live app's, its KV event
batches, its warnings) and what `run_replay` returns and says for each kind of file."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from rich.text import Span, Text
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import Input, Static

from kvtop.baseline.overlay import BaselineOverlay, baseline_overlay
from kvtop.cli import main
from kvtop.collect.kv_events import BlockStored, KvEventBatch
from kvtop.collect.target import Scrape
from kvtop.exits import EXIT_NO_DATA, EXIT_OK, EXIT_USAGE
from kvtop.store.recording import RecordingError, RecordingWriter, open_recording
from kvtop.ui.app import INTERVALS
from kvtop.ui.replay import (
    SEEK_FAR_S,
    SEEK_S,
    YIELD_EVERY,
    NothingToReplay,
    ReplayApp,
    ReplayBar,
    clock_text,
    position,
    replay_app,
    run_replay,
)
from kvtop.ui.screens.help import HelpScreen
from tests.scenarios.app import HOST_A, HOST_B, T0, UNDER_LOAD, write_recording
from tests.scenarios.app import until as within_deadline
from tests.support.paths import fixture_text

SIZE = (120, 30)
SMALL = "llamacpp-2025-build-zh-doc.txt"  # a real body of 1.5 KB: long recordings stay cheap


# -- the clock and the position, as text ------------------------------------------------------


@pytest.fixture
def local_time_not_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A machine whose local time is 5 hours behind UTC: the bar must still say UTC."""
    monkeypatch.setenv("TZ", "EST+5")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("local_time_not_utc")
def test_the_clock_is_recording_time_in_utc_to_the_second() -> None:
    assert clock_text(T0) == "2026-01-01 00:00:00Z"
    assert clock_text(T0 + 0.999) == "2026-01-01 00:00:00Z"
    assert clock_text(T0 - 1) == "2025-12-31 23:59:59Z"
    assert clock_text(T0 + 3661) == "2026-01-01 01:01:01Z"


@pytest.mark.parametrize(("seconds", "shown"), [
    (-5.0, "0:00"), (0.0, "0:00"), (0.9, "0:00"), (1.0, "0:01"), (59.9, "0:59"),
    (60.0, "1:00"), (599.0, "9:59"), (3599.0, "59:59"), (3600.0, "1:00:00"),
    (3661.0, "1:01:01"), (36_000.0 + 59 * 60 + 59, "10:59:59"),
])
def test_a_position_is_minutes_and_seconds_and_hours_once_there_are_any(
        seconds: float, shown: str) -> None:
    assert position(seconds) == shown


# -- helpers -------------------------------------------------------------------------------


async def until(pilot: Pilot[object], ready: Callable[[], object]) -> bool:
    """Whether ``ready()`` turns true within the deadline, giving up at once when the app has
    stopped on an error (nothing more would come: waiting the whole deadline for it made each
    such planted bug cost a minute)."""
    app = pilot.app
    return (await within_deadline(pilot, lambda: app._exception is not None or ready())
            and app._exception is None)


def bar(app: ReplayApp) -> Text:
    content = app.replay_bar.content
    assert isinstance(content, Text)
    return content


def bar_line(app: ReplayApp) -> str:
    return bar(app).plain


def now(app: ReplayApp) -> float:
    """The replay's position, in seconds from the recording's start."""
    return app.replay.now() - T0


def good_t(app: ReplayApp) -> dict[str, float | None]:
    """Each host's last good scrape, in seconds from the recording's start."""
    return {url: None if t.state.last_good_t is None else t.state.last_good_t - T0
            for url, t in app.trackers.items()}


def both(seconds: float) -> dict[str, float | None]:
    return {HOST_A.url: seconds, HOST_B.url: seconds}


def told(app: App[None]) -> list[tuple[str, str, str, float, bool]]:
    return [(n.message, n.title, n.severity, n.timeout, n.markup) for n in app._notifications]


def sparse(path: Path, seconds: int, every: int, body: str = SMALL) -> Path:
    """One host scraped every ``every`` s for ``seconds``, its interval ``every``."""
    with RecordingWriter(path, interval_s=float(every), targets=[HOST_A]) as writer:
        for t in range(0, seconds, every):
            writer.write(Scrape(HOST_A, T0 + t, fixture_text(body)))
    return path


def saved_baseline(path: Path, capsys: pytest.CaptureFixture[str]) -> BaselineOverlay:
    """A baseline saved from the recording at ``path`` (by kvtop's own command), to draw."""
    saved = path.with_name("base.json")
    assert main(["baseline", "save", str(saved), "--from", str(path), "--json"]) == EXIT_OK
    capsys.readouterr()
    return baseline_overlay(str(saved), {})


async def paused_at_start(app: ReplayApp, pilot: Pilot[None]) -> None:
    """The first round folded and the replay paused there (a seek back to it: a pause lands
    a few milliseconds on)."""
    assert await until(pilot, lambda: app.replay.paused is False and good_t(app) == both(0))
    await pilot.press("space", "left_square_bracket")
    assert app.replay.paused and now(app) == 0


# -- the bar -------------------------------------------------------------------------------


async def test_the_bar_says_play_state_speed_clock_position_and_file_in_their_roles(
        tmp_path: Path) -> None:
    app = replay_app(write_recording(tmp_path / "rec.jsonl"), speed=0.5, snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: good_t(app) == both(0))
        widget = app.query_one("#replay", ReplayBar)
        assert widget is app.replay_bar
        flag = widget.get_component_rich_style("replay--flag")
        key = widget.get_component_rich_style("replay--key")
        assert flag.bold and not key.bold and flag.color != key.color  # kvtop.tcss's roles
        text = bar(app)
        line = "▶ REPLAY ×0.5  2026-01-01 00:00:00Z  0:00/4:55  rec.jsonl"
        assert text.plain == line
        length = line.index("/")
        assert text.spans == [Span(0, 8, flag), Span(length, length + 7, key),
                              Span(length + 7, len(line), key)]
        assert (text.no_wrap, text.overflow) == (True, "ellipsis")  # cut, never two lines
        assert app.query_one("#replay").region.y == 0  # above the live app's header
        await pilot.press("space")
        assert bar_line(app) == "❚❚ PAUSED ×0.5  2026-01-01 00:00:00Z  0:00/4:55  rec.jsonl"
        assert bar(app).spans[0] == Span(0, 9, flag)


async def test_a_file_name_is_shown_escaped_never_as_markup(tmp_path: Path) -> None:
    path = write_recording(tmp_path / "r [b]x\x1b]52;c.jsonl", 10)
    app = replay_app(path, snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: good_t(app) == both(0))
        assert app.replay_name == "r [b]x\\x1b]52;c.jsonl"
        assert bar_line(app) == ("▶ REPLAY ×1  2026-01-01 00:00:00Z  0:00/0:05  "
                                 "r [b]x\\x1b]52;c.jsonl")


async def test_a_draw_or_a_key_landing_at_shutdown_paints_nothing(tmp_path: Path) -> None:
    """A redraw timer or a key handled while the app shuts down: the bar is off the screen
    (it once raised from the bar and ended the replay with a crash)."""
    app = replay_app(write_recording(tmp_path / "rec.jsonl", 10), snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: good_t(app) == both(0))
        shown = bar_line(app)
    app._draw()
    app._show_bar()
    assert bar_line(app) == shown


# -- the keys ------------------------------------------------------------------------------


async def test_space_pauses_at_once_and_the_frame_follows_in_a_twentieth_of_a_second(
        tmp_path: Path) -> None:
    app = replay_app(write_recording(tmp_path / "rec.jsonl"), snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: good_t(app) == both(0))
        before = set(app._timers)
        app.action_play_pause()
        assert bar_line(app).startswith("❚❚ PAUSED ×1 ")  # the bar at once, not at a redraw
        [timer] = set(app._timers) - before
        assert (timer._interval, timer._callback.args, timer._repeat) == (0.05, (app._draw,), 0)
        app.action_play_pause()
        assert app.replay.paused is False
        assert bar_line(app).startswith("▶ REPLAY ×1 ")


async def test_a_step_pauses_and_folds_one_round_up_to_the_last_and_none_past_it(
        tmp_path: Path) -> None:
    """Each key's position is asserted as soon as the key is handled (the bar shows it at
    once); its scrapes are folded just after."""
    app = replay_app(write_recording(tmp_path / "rec.jsonl", 20), snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: good_t(app) == both(0))
        await pilot.press("full_stop")  # playing: the step pauses it first
        assert (app.replay.paused, now(app)) == (True, 5)
        assert bar_line(app) == "❚❚ PAUSED ×1  2026-01-01 00:00:05Z  0:05/0:15  rec.jsonl"
        assert await until(pilot, lambda: good_t(app) == both(5))
        await pilot.press("full_stop")  # paused: stays paused
        assert (app.replay.paused, now(app)) == (True, 10)
        assert await until(pilot, lambda: good_t(app) == both(10))
        await pilot.press("full_stop")  # the last round: the end
        assert (app.replay.paused, now(app)) == (True, 15)
        assert await until(pilot, lambda: good_t(app) == both(15) and app.replay.finished)
        await pilot.press("full_stop")  # one past the end: nothing
        end = "■ END ×1  2026-01-01 00:00:15Z  0:15/0:15  rec.jsonl"
        assert (now(app), good_t(app), app.replay.paused, bar_line(app)) == (
            15, both(15), True, end)
        app.action_play_pause()  # played on past the end: says so until it stops again
        assert bar_line(app) == "▶ REPLAY ×1  2026-01-01 00:00:15Z  0:15/0:15  rec.jsonl"
        assert await until(pilot, lambda: bar_line(app) == end)


async def test_seeks_move_a_minute_or_ten_within_the_recording(tmp_path: Path) -> None:
    assert (SEEK_S, SEEK_FAR_S) == (60.0, 600.0)
    path = sparse(tmp_path / "long.jsonl", 1500, 30)  # 0:00 to 24:30, a scrape each 30 s
    app = replay_app(path, speed=0.1, snapshot_dir=tmp_path)  # the next scrape 5 min away
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: good_t(app) == {HOST_A.url: 0})
        for key, seconds in (("left_square_bracket", 0),  # the first frame: stays
                             ("left_curly_bracket", 0),
                             ("right_square_bracket", 60), ("right_curly_bracket", 660),
                             ("left_square_bracket", 600), ("right_curly_bracket", 1200),
                             ("right_curly_bracket", 1470),  # past the end: the last frame
                             ("right_square_bracket", 1470),
                             ("left_curly_bracket", 870), ("left_curly_bracket", 270),
                             ("left_square_bracket", 210), ("left_curly_bracket", 0)):
            await pilot.press(key)
            assert now(app) == seconds, key
            assert bar_line(app).split("  ")[2] == f"{position(seconds)}/24:30", key
            assert await until(pilot, lambda s=seconds: good_t(app) == {HOST_A.url: s}), key


async def test_a_seek_back_rebuilds_the_trackers_from_the_start(tmp_path: Path) -> None:
    app = replay_app(write_recording(tmp_path / "rec.jsonl"), snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await paused_at_start(app, pilot)
        await pilot.press("right_square_bracket")
        assert now(app) == 60
        assert await until(pilot, lambda: good_t(app) == both(60))
        tracker = app.trackers[HOST_A.url]
        await pilot.press("left_square_bracket")  # to the start: every tracker afresh
        assert now(app) == 0
        assert await until(pilot, lambda: good_t(app) == both(0))
        rebuilt = app.trackers[HOST_A.url]
        assert rebuilt is not tracker
        assert [len(h) for h in rebuilt.history.values()] == [1]
        assert bar_line(app).startswith("❚❚ PAUSED ×1  2026-01-01 00:00:00Z  0:00/4:55  ")


async def test_speed_halves_and_doubles_within_its_bounds_and_says_so(tmp_path: Path) -> None:
    app = replay_app(write_recording(tmp_path / "rec.jsonl"), snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await paused_at_start(app, pilot)
        await pilot.press("less_than_sign")
        assert app.replay.speed == 0.5 and bar_line(app).startswith("❚❚ PAUSED ×0.5  ")
        await pilot.press("less_than_sign", "less_than_sign", "less_than_sign")
        assert app.replay.speed == 0.1  # the slowest: 0.0625 is not offered
        await pilot.press("greater_than_sign")
        assert app.replay.speed == 0.2 and bar_line(app).startswith("❚❚ PAUSED ×0.2  ")
        assert [m for m, *_ in told(app)] == ["replay speed ×0.5", "replay speed ×0.25",
                                              "replay speed ×0.125", "replay speed ×0.1",
                                              "replay speed ×0.2"]
        assert told(app)[0] == ("replay speed ×0.5", "", "information", 2, False)


async def test_the_interval_keys_do_nothing_and_the_search_keeps_its_full_stop(
        tmp_path: Path) -> None:
    app = replay_app(write_recording(tmp_path / "rec.jsonl"), snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await paused_at_start(app, pilot)
        await pilot.press("plus", "minus", "equals_sign")
        assert app.interval_s == 5.0 and told(app) == []  # the recording's interval holds
        offered = app.screen.active_bindings  # not even offered as a disabled key
        assert {"plus", "minus", "equals_sign"} & set(offered) == set()
        assert offered["full_stop"].enabled and offered["space"].enabled
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        # the box takes its `.` itself: no printable key's binding is offered meanwhile
        offered = app.screen.active_bindings
        assert {"full_stop", "space", "left_square_bracket", "less_than_sign"} & set(
            offered) == set()
        await pilot.press("1", "0", "full_stop", "0")
        await pilot.pause()
        assert app.query_one("#filter", Input).value == "10.0"
        assert now(app) == 0 and good_t(app) == both(0)  # typed, not stepped
        await pilot.press("escape")
        assert not isinstance(app.focused, Input)
        assert app.screen.active_bindings["full_stop"].enabled
        await pilot.press("full_stop")
        assert now(app) == 5
        assert await until(pilot, lambda: good_t(app) == both(5))


async def test_the_help_lists_the_replay_keys(tmp_path: Path) -> None:
    app = replay_app(write_recording(tmp_path / "rec.jsonl", 10), snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        screen = " ".join(" ".join(str(w.render()).split()) for w in app.screen.query(Static))
        for key, what in (("space", "pause / resume the replay"),
                          (".", "step a round of scrapes"),
                          ("[ ]", "seek back / forward 1m"),
                          ("{ }", "seek back / forward 10m"),
                          ("< >", "replay speed ×0.5 / ×2")):
            assert f"{key} {what}" in screen, key


async def test_live_pause_stops_the_frames_and_the_bar_goes_on(tmp_path: Path) -> None:
    """p freezes the display as live (forced frames still come); the replay goes on."""
    app = replay_app(write_recording(tmp_path / "rec.jsonl"), snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await paused_at_start(app, pilot)
        assert "PAUSED" not in str(app.summary.render())  # the replay's pause: the bar's
        await pilot.press("p")
        assert app.view.paused and str(app.summary.render()).endswith("  PAUSED")  # at once
        frozen = str(app.summary.render())
        await pilot.press("full_stop")
        assert bar_line(app) == "❚❚ PAUSED ×1  2026-01-01 00:00:05Z  0:05/4:55  rec.jsonl"
        assert await until(pilot, lambda: good_t(app) == both(5))
        app._draw()  # a timed frame (the draw clock's call) while frozen: nothing painted
        assert str(app.summary.render()) == frozen
        await pilot.press("p")  # the second round's rates, drawn at once
        assert str(app.summary.render()) == frozen.replace(
            "tok/s – in – out", "tok/s 0 in 0 out").removesuffix("  PAUSED")


# -- a long catch-up ---------------------------------------------------------------------


async def test_a_long_catch_up_lets_the_loop_in_every_yield_every_scrapes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A seek that folds hours of scrapes at once still lets keys and redraws in: the fold
    gives the loop a turn (asyncio.sleep(0), watched as it is called) after every
    YIELD_EVERY scrapes, and at no other."""
    assert YIELD_EVERY == 100
    path = sparse(tmp_path / "long.jsonl", 300, 1)
    app = replay_app(path, speed=0.1, snapshot_dir=tmp_path)  # the next scrape 10 s away
    turns: list[tuple[float | None, object]] = []  # (the last scrape folded, the delay)
    sleep = asyncio.sleep

    def watched_sleep(delay: float, *args: object) -> Awaitable[object]:
        if "_paced_scrape" in sys._getframe(1).f_code.co_name:
            turns.append((good_t(app)[HOST_A.url], delay))
        return sleep(delay, *args)

    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: good_t(app) == {HOST_A.url: 0})
        monkeypatch.setattr(asyncio, "sleep", watched_sleep)
        await pilot.press("right_curly_bracket")
        assert now(app) == 299
        assert await until(pilot, lambda: good_t(app) == {HOST_A.url: 299})
    # the first scrape was the app's first delivery: the 100th is the one at 99 s
    assert turns == [(99, 0), (199, 0), (299, 0)]


# -- replay_app: what it makes of a file -------------------------------------------------


@pytest.mark.parametrize(("interval_s", "used"), [
    (0.1, 0.25), (INTERVALS[0], 0.25), (5.0, 5.0), (INTERVALS[-1], 60.0), (3600.0, 60.0)])
def test_the_app_redraws_at_the_recording_s_interval_as_the_live_app_offers(
        tmp_path: Path, interval_s: float, used: float) -> None:
    path = tmp_path / "rec.jsonl"
    with RecordingWriter(path, interval_s=interval_s, targets=[HOST_A]) as writer:
        writer.write(Scrape(HOST_A, T0, fixture_text(SMALL)))
    app = replay_app(path)
    assert app.config.interval_s == app.interval_s == used
    assert (app.replay.speed, app.config.snapshot_dir, app.config.baseline) == (1.0, None, None)


async def test_the_app_is_built_on_the_file_s_targets_and_clock_and_what_it_is_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_recording(tmp_path / "rec.jsonl", 30)
    overlay = saved_baseline(path, capsys)
    told_lines: list[str] = []
    app = replay_app(path, speed=1000, snapshot_dir=tmp_path / "snaps", tell=told_lines.append,
                     baseline=overlay)
    config = app.config
    assert [t.url for t in config.targets] == [HOST_A.url, HOST_B.url]
    assert (config.no_gpu, config.snapshot_dir, config.baseline) == (
        True, tmp_path / "snaps", overlay)
    assert config.source_factory(config) is app.replay and config.clock == app.replay.now
    assert (app.replay.speed, app.replay_name, told_lines) == (1000, "rec.jsonl", [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.replay.finished and good_t(app) == both(25))
        assert app.config.clock() == T0 + 25
        assert app.gpu_watch.views == []  # no GPU read on this machine: not the recording's


async def test_the_recording_s_kv_event_batches_reach_the_app_s_tap(tmp_path: Path) -> None:
    path = tmp_path / "kv.jsonl"
    with RecordingWriter(path, interval_s=1.0, targets=[HOST_A]) as writer:
        writer.write(Scrape(HOST_A, T0, fixture_text(UNDER_LOAD)))
        for seq in range(3):
            stored = BlockStored((seq * 10 + 1, seq * 10 + 2), None, 32, 16, "GPU")
            writer.write_kv_events(KvEventBatch(t=T0 + seq + 0.5, rank=0, seq=seq,
                                                ts=T0 + seq, events=(stored,)), HOST_A)
        writer.write(Scrape(HOST_A, T0 + 5, fixture_text(UNDER_LOAD)))
    app = replay_app(path, speed=1000, snapshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.replay.finished)
        anatomy = app.trackers[HOST_A.url].kv_events[0]
        assert (anatomy.batches, anatomy.stored) == (3, 6)


def test_skipped_lines_are_told_each_naming_the_file(tmp_path: Path) -> None:
    path = write_recording(tmp_path / "rec.jsonl", 10)
    with path.open("a") as file:
        file.write("not json\n")
    lines: list[str] = []
    replay_app(path, snapshot_dir=tmp_path, tell=lines.append)
    [warning] = open_recording(path).warnings
    assert lines == [f"{path}: {warning}"]


def test_a_file_without_scrapes_or_not_a_recording_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    with RecordingWriter(empty, interval_s=5.0, targets=[HOST_A]):
        pass
    with pytest.raises(NothingToReplay) as nothing:
        replay_app(empty)
    assert str(nothing.value) == f"{empty} holds no scrapes"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(RecordingError):
        replay_app(bad)


# -- run_replay: exit codes and what it says ---------------------------------------------


def test_run_replay_says_why_it_cannot_replay_and_exits_2_or_3(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.jsonl"
    assert run_replay(missing, snapshot_dir=tmp_path) == EXIT_USAGE
    with pytest.raises(RecordingError) as error:
        open_recording(missing)
    assert capsys.readouterr() == ("", f"kvtop replay: {error.value}\n")
    empty = tmp_path / "empty.jsonl"
    with RecordingWriter(empty, interval_s=5.0, targets=[HOST_A]):
        pass
    assert run_replay(empty, snapshot_dir=tmp_path) == EXIT_NO_DATA
    assert capsys.readouterr() == ("", f"kvtop replay: {empty} holds no scrapes\n")


def test_run_replay_runs_the_app_and_exits_0_when_it_quits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = write_recording(tmp_path / "rec.jsonl", 10)
    overlay = saved_baseline(path, capsys)
    with path.open("a") as file:
        file.write("not json\n")
    ran: list[ReplayApp] = []
    run = App.run

    def headless_run(app: App[object], **_: object) -> object:
        assert isinstance(app, ReplayApp)
        ran.append(app)

        async def quit_when_shown(pilot: Pilot[object]) -> None:
            assert await until(pilot, lambda: good_t(app)[HOST_B.url] is not None)
            await pilot.press("q")

        return run(app, headless=True, size=SIZE, auto_pilot=quit_when_shown)

    monkeypatch.setattr(App, "run", headless_run)
    assert run_replay(path, snapshot_dir=tmp_path, baseline=overlay) == EXIT_OK
    [warning] = open_recording(path).warnings
    assert capsys.readouterr() == ("", f"kvtop replay: {path}: {warning}\n")
    [app] = ran
    assert (app.replay.speed, app.config.snapshot_dir, app.config.baseline) == (
        1.0, tmp_path, overlay)  # real time by default
    assert run_replay(path, speed=1000, snapshot_dir=tmp_path) == EXIT_OK
    assert (ran[1].replay.speed, ran[1].config.baseline) == (1000, None)
