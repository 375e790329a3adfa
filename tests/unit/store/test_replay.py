"""Replay delivers a recording's scrapes on the recording clock, and pauses, steps, seeks.

A replay as a person drives it (``kvtop replay``: space, ., [ ], < >): its clock is the
recording's, its speed stays within 0.1x and 1000x, a step delivers the next round at once,
a seek lands within the recording (back: everything again from the start, once), and a
replay that reached its end pauses instead of spinning."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from kvtop.collect.target import Scrape, Target
from kvtop.store.recording import Recording
from kvtop.store.replay import MAX_SPEED, MIN_SPEED, ReplaySource
from tests.support.waiting import DEADLINE_S, eventually

TARGET = Target.from_spec("127.0.0.1:8000")


def recording_at(times: list[float]) -> Recording:
    return Recording({"format": "kvtop-recording", "version": 1, "interval_s": 1.0},
                     [Scrape(TARGET, t, body=f"x {t}\n") for t in times])


async def run_until(source: ReplaySource, seen: list[float], count: int) -> None:
    """Run the replay until ``count`` scrapes in all were delivered."""
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(lambda s: seen.append(s.t), stop=stop))
    try:
        await eventually(lambda: len(seen) >= count, f"{count} scrapes delivered")
    finally:
        stop.set()
        await task


async def test_plays_in_order_at_speed() -> None:
    # 40 recorded seconds at 100x: 0.4 s; at 1x (speed ignored) 40 s
    source = ReplaySource(recording_at([100.0, 120.0, 110.0, 140.0]), speed=100.0)
    seen: list[float] = []
    started = time.monotonic()
    await run_until(source, seen, 4)
    elapsed = time.monotonic() - started
    assert seen == [100.0, 110.0, 120.0, 140.0]
    assert 0.4 * 0.9 <= elapsed < 40 / 2  # the recording clock can't run faster than asked
    assert source.now() == 140.0 and source.finished


async def test_pause_and_step() -> None:
    # At 1000x the next scrape is 10 ms away: a replay ignoring its pause delivers it at once.
    source = ReplaySource(recording_at([0.0, 10.0, 20.0]), speed=1000.0)
    source.toggle_pause()
    seen: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(lambda s: seen.append(s.t), stop=stop))
    await eventually(lambda: seen, "the scrape at the start position")
    await asyncio.sleep(0.2)  # 20x what an unpaused replay needs to deliver the next
    assert seen == [0.0] and source.now() == 0.0  # paused: the clock stands too
    source.step()
    await eventually(lambda: len(seen) == 2, "the stepped scrape")
    assert seen == [0.0, 10.0] and source.now() == 10.0 and source.paused
    source.toggle_pause()
    await eventually(lambda: len(seen) == 3, "the rest once resumed")
    stop.set()
    await task


async def test_seek_back_rewinds_and_replays_up_to_position() -> None:
    rewinds: list[int] = []
    source = ReplaySource(recording_at([0.0, 1.0, 2.0, 3.0]), speed=1000.0,
                          on_rewind=lambda: rewinds.append(1))
    seen: list[float] = []
    await run_until(source, seen, 4)
    source.seek(1.5)
    await run_until(source, seen, 6)
    assert rewinds == [1]
    assert seen == [0.0, 1.0, 2.0, 3.0, 0.0, 1.0]
    assert source.now() == 1.5


async def test_empty_recording_does_not_spin() -> None:
    source = ReplaySource(recording_at([]))
    rounds: list[int] = []
    deliver = source._deliver_due

    async def counted(on_scrape) -> None:  # type: ignore[no-untyped-def]
        rounds.append(1)
        await deliver(on_scrape)

    source._deliver_due = counted  # type: ignore[method-assign]
    seen: list[Scrape] = []
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(seen.append, stop=stop))
    await asyncio.sleep(0.1)  # a spinning replay goes round thousands of times meanwhile
    assert len(rounds) == 1 and seen == [] and source.finished  # asleep until told
    stop.set()
    await asyncio.wait_for(task, DEADLINE_S)


def recording(times: list[float], interval_s: float = 2.0) -> Recording:
    return Recording({"format": "kvtop-recording", "version": 1, "interval_s": interval_s},
                     [Scrape(TARGET, t, body=f"x {t}\n") for t in times])


class Player:
    """A replay running as the app runs it, with what it delivered."""

    def __init__(self, source: ReplaySource) -> None:
        self.source = source
        self.seen: list[float] = []
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Player:
        self.task = asyncio.create_task(self.source.run(self.on_scrape, stop=self.stop))
        return self

    async def on_scrape(self, scrape: Scrape) -> None:  # a consumer that awaits, as the app
        self.seen.append(scrape.t)

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)


def test_the_replay_starts_paused_at_nothing_on_the_recordings_clock() -> None:
    source = ReplaySource(recording([30.0, 10.0, 20.0], interval_s=2.5))
    assert (source.start_t, source.end_t, source.interval_s) == (10.0, 30.0, 2.5)
    assert source.now() == 10.0 and not source.paused and not source.finished
    assert source.speed == 1.0


def test_speed_stays_between_a_tenth_and_a_thousand() -> None:
    source = ReplaySource(recording([0.0]), speed=0.0)
    assert source.speed == MIN_SPEED == 0.1
    for asked, kept in ((5000.0, MAX_SPEED), (1000.0, 1000.0), (0.1, 0.1), (0.05, 0.1),
                        (2.0, 2.0)):
        source.set_speed(asked)
        assert source.speed == kept
    assert ReplaySource(recording([0.0]), speed=1e9).speed == 1000.0


def test_pause_toggles() -> None:
    source = ReplaySource(recording([0.0]))
    source.toggle_pause()
    assert source.paused
    source.toggle_pause()
    assert not source.paused


async def test_a_step_delivers_the_next_scrape_at_once_and_nothing_past_the_end() -> None:
    source = ReplaySource(recording([0.0, 100.0, 200.0]), speed=0.1)  # 1000 s to the next
    source.toggle_pause()
    async with Player(source) as player:
        await eventually(lambda: player.seen == [0.0], "the scrape at the start")
        source.step()
        await eventually(lambda: player.seen == [0.0, 100.0], "the stepped scrape")
        assert source.now() == 100.0
        source.step()
        await eventually(lambda: source.finished, "the last scrape")
        assert player.seen == [0.0, 100.0, 200.0] and source.now() == 200.0
        source.step()  # at the end: nothing to step to
        assert source.now() == 200.0


async def test_a_step_is_a_round_of_a_fleet_and_moves_the_clock_an_interval() -> None:
    # four targets read milliseconds apart each second (interval 1 s): one step takes in
    # the whole next round, and the clock (the replay bar's elapsed time) moves by it
    times = [t + k * 0.01 for t in (0.0, 1.0, 2.0) for k in range(4)]
    source = ReplaySource(recording(times, interval_s=1.0), speed=0.1)
    source.toggle_pause()
    async with Player(source) as player:
        await eventually(lambda: player.seen == [0.0], "the scrape at the start")
        source.step()
        await eventually(lambda: len(player.seen) == 4, "the rest of the first round")
        source.step()
        await eventually(lambda: len(player.seen) == 8, "the second round, whole")
        assert player.seen[-1] == 1.03 and source.now() == 1.03
        await asyncio.sleep(0.1)
        assert len(player.seen) == 8  # not a scrape of the round after (0.5 s on at most)


async def test_the_end_pauses_the_replay() -> None:
    source = ReplaySource(recording([0.0, 1.0]), speed=1000.0)
    async with Player(source) as player:
        await eventually(lambda: source.paused, "paused at the end")
        assert player.seen == [0.0, 1.0] and source.finished


async def test_a_seek_forward_delivers_everything_up_to_it_at_once() -> None:
    rewinds: list[int] = []
    source = ReplaySource(recording([0.0, 100.0, 200.0, 300.0]), speed=0.1,
                          on_rewind=lambda: rewinds.append(1))
    async with Player(source) as player:
        await eventually(lambda: player.seen == [0.0], "the scrape at the start")
        source.seek(250.0)
        await eventually(lambda: player.seen == [0.0, 100.0, 200.0], "up to 250 s")
        assert source.now() == 250.0 and rewinds == []


async def test_a_seek_lands_within_the_recording() -> None:
    source = ReplaySource(recording([10.0, 20.0, 30.0]), speed=0.1)
    async with Player(source) as player:
        source.seek(1e9)
        await eventually(lambda: player.seen == [10.0, 20.0, 30.0], "all of it")
        assert source.now() == 30.0
        source.seek(-1e9)
        await eventually(lambda: player.seen[3:] == [10.0], "the start again")
        assert source.now() == 10.0


async def test_a_seek_back_rewinds_once_and_replays_from_the_start() -> None:
    rewinds: list[int] = []
    source = ReplaySource(recording([0.0, 1.0, 2.0, 3.0]), speed=1000.0,
                          on_rewind=lambda: rewinds.append(1))
    async with Player(source) as player:
        await eventually(lambda: source.finished, "the whole recording")
        source.seek(1.0)  # the scrape at 1.0 was delivered: behind the last one
        await eventually(lambda: len(player.seen) == 6, "0 and 1 again")
        assert player.seen == [0.0, 1.0, 2.0, 3.0, 0.0, 1.0] and rewinds == [1]
        source.seek(1.0)  # at the last one delivered, not behind it: no rewind
        source.seek(2.5)
        await eventually(lambda: player.seen[-1] == 2.0, "2 once more")
        assert player.seen == [0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0] and rewinds == [1]


async def test_every_seek_and_step_while_playing_moves_the_clock_for_good() -> None:
    # at 0.1x the scrape at 1000 s is hours away: the replay sleeps, and each move wakes it
    source = ReplaySource(recording([0.0, 50.0, 60.0, 70.0, 80.0, 1000.0]), speed=0.1)
    async with Player(source) as player:
        await eventually(lambda: player.seen == [0.0], "the scrape at the start")
        source.seek(50.0)
        await eventually(lambda: player.seen[-1] == 50.0, "the scrape sought")
        source.seek(60.0)  # a second move while asleep again
        await eventually(lambda: player.seen[-1] == 60.0, "the next scrape sought")
        source.step()
        await eventually(lambda: player.seen[-1] == 70.0, "the stepped scrape")
        source.step()
        await eventually(lambda: player.seen[-1] == 80.0, "the next stepped scrape")
        assert source.now() == 80.0 and player.seen == [0.0, 50.0, 60.0, 70.0, 80.0]


async def test_the_clock_runs_at_the_speed_asked_for() -> None:
    source = ReplaySource(recording([0.0, 2.0]), speed=10.0)  # 0.2 s to the next
    loop = asyncio.get_running_loop()
    async with Player(source) as player:
        started = loop.time()
        await eventually(lambda: len(player.seen) == 2, "the second scrape")
        elapsed = loop.time() - started
    assert elapsed >= 0.2 * 0.9  # never faster than asked
    assert source.now() == 2.0


async def test_a_seek_back_while_a_scrape_is_being_taken_in_rewinds_before_replaying() -> None:
    events: list[object] = []
    source = ReplaySource(recording([0.0, 1.0, 2.0, 3.0]), speed=1000.0,
                          on_rewind=lambda: events.append("rewind"))

    async def on_scrape(scrape: Scrape) -> None:  # the seek lands while the app takes it in
        events.append(scrape.t)
        if scrape.t == 3.0 and "rewind" not in events:
            source.seek(1.0)
        await asyncio.sleep(0)

    stop = asyncio.Event()
    task = asyncio.create_task(source.run(on_scrape, stop=stop))
    await eventually(lambda: len(events) >= 7, "the rewind and 0 and 1 again")
    stop.set()
    await asyncio.wait_for(task, 30)
    assert events[:7] == [0.0, 1.0, 2.0, 3.0, "rewind", 0.0, 1.0]


async def test_a_seek_back_while_paused_replays_up_to_it_at_once() -> None:
    rewinds: list[int] = []
    source = ReplaySource(recording([0.0, 1.0, 2.0, 3.0]), on_rewind=lambda: rewinds.append(1))
    source.toggle_pause()
    seen: list[float] = []

    async def on_scrape(scrape: Scrape) -> None:
        seen.append(scrape.t)
        if scrape.t == 2.0 and not rewinds:
            source.seek(1.0)  # back, while the seek to 2.5 is still being delivered
        await asyncio.sleep(0)

    stop = asyncio.Event()
    task = asyncio.create_task(source.run(on_scrape, stop=stop))
    await eventually(lambda: seen == [0.0], "the scrape at the start")
    source.seek(2.5)
    await eventually(lambda: len(seen) == 5, "0 and 1 again, though paused")
    stop.set()
    await asyncio.wait_for(task, 30)
    assert seen == [0.0, 1.0, 2.0, 0.0, 1.0] and rewinds == [1] and source.now() == 1.0


async def test_a_seek_before_anything_was_replayed_is_no_rewind() -> None:
    rewinds: list[int] = []
    source = ReplaySource(recording([0.0, 1.0, 2.0, 3.0]), speed=0.1,
                          on_rewind=lambda: rewinds.append(1))
    source.seek(2.0)
    async with Player(source) as player:
        await eventually(lambda: player.seen == [0.0, 1.0, 2.0], "up to 2 at once")
    assert rewinds == []


class Stream:
    """A recording's scrapes as a file streams them: closed when the replay lets go."""

    def __init__(self, scrapes: list[Scrape]) -> None:
        self._scrapes = iter(scrapes)
        self.closed = False

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Scrape:
        return next(self._scrapes)

    def close(self) -> None:
        self.closed = True


class Streamed(Recording):
    def __init__(self, times: list[float]) -> None:
        super().__init__({"format": "kvtop-recording", "version": 1, "interval_s": 1.0},
                         [Scrape(TARGET, t, body=f"x {t}\n") for t in times])
        self.streams: list[Stream] = []

    def in_time_order(self) -> Iterator[Scrape]:
        self.streams.append(Stream(list(super().in_time_order())))
        return self.streams[-1]


async def test_a_seek_back_closes_the_stream_it_leaves() -> None:
    streamed = Streamed([0.0, 1.0, 2.0])
    source = ReplaySource(streamed, speed=1000.0)
    async with Player(source) as player:
        await eventually(lambda: source.finished, "the whole recording")
        source.seek(0.0)
        await eventually(lambda: len(player.seen) == 4, "the start again")
    assert [s.closed for s in streamed.streams] == [True, False]


async def test_a_recording_of_todays_unix_times_plays_at_its_speed() -> None:
    t0 = 1_767_225_600.0
    source = ReplaySource(recording([t0, t0 + 1.0, t0 + 2.0]), speed=1000.0)
    async with Player(source) as player:
        await eventually(lambda: player.seen == [t0, t0 + 1.0, t0 + 2.0], "2 s at 1000x")


async def test_pausing_stops_the_clock_where_it_is() -> None:
    # at 0.01x the next scrape, half a recorded second away, is 50 s off
    source = ReplaySource(recording([0.0, 0.5]), speed=0.01)
    async with Player(source) as player:
        await eventually(lambda: player.seen == [0.0], "the scrape at the start")
        source.toggle_pause()  # wakes the sleeping replay, which stops its clock
        await eventually(lambda: source.now() > 0.0, "the clock advanced to the pause")
        assert 0.0 < source.now() < 0.5 and player.seen == [0.0]


async def test_kv_event_batches_are_delivered_in_their_place_when_asked() -> None:
    from kvtop.collect.kv_events import KvEventBatch
    from kvtop.store.recording import TargetKvEvents

    events = [TargetKvEvents(TARGET, KvEventBatch(t=t, rank=0, seq=i))
              for i, t in enumerate((0.5, 1.5))]
    recorded = Recording({"format": "kvtop-recording", "version": 1, "interval_s": 1.0},
                         [Scrape(TARGET, t, body="x 1\n") for t in (0.0, 1.0, 2.0)],
                         kv_events=events)
    order: list[str] = []
    source = ReplaySource(recorded, speed=1000.0,
                          on_kv_events=lambda e: order.append(f"e{e.t}"))
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(lambda s: order.append(f"s{s.t}"), stop=stop))
    await eventually(lambda: len(order) == 5, "scrapes and batches delivered")
    stop.set()
    await task
    assert order == ["s0.0", "e0.5", "s1.0", "e1.5", "s2.0"]
    plain: list[float] = []
    await run_until(ReplaySource(recorded, speed=1000.0), plain, 3)  # not asked: scrapes only
    assert plain == [0.0, 1.0, 2.0]
