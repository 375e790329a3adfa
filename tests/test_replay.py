"""Replay delivers a recording's scrapes on the recording clock, and pauses, steps, seeks."""

from __future__ import annotations

import asyncio
import time

from kvtop.collect.target import Scrape, Target
from kvtop.store.recording import Recording
from kvtop.store.replay import ReplaySource
from tests.waiting import DEADLINE_S, eventually

TARGET = Target.from_spec("127.0.0.1:8000")


def recording(times: list[float]) -> Recording:
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
    source = ReplaySource(recording([100.0, 120.0, 110.0, 140.0]), speed=100.0)
    seen: list[float] = []
    started = time.monotonic()
    await run_until(source, seen, 4)
    elapsed = time.monotonic() - started
    assert seen == [100.0, 110.0, 120.0, 140.0]
    assert 0.4 * 0.9 <= elapsed < 40 / 2  # the recording clock can't run faster than asked
    assert source.now() == 140.0 and source.finished


async def test_pause_and_step() -> None:
    # At 1000x the next scrape is 10 ms away: a replay ignoring its pause delivers it at once.
    source = ReplaySource(recording([0.0, 10.0, 20.0]), speed=1000.0)
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
    source = ReplaySource(recording([0.0, 1.0, 2.0, 3.0]), speed=1000.0,
                          on_rewind=lambda: rewinds.append(1))
    seen: list[float] = []
    await run_until(source, seen, 4)
    source.seek(1.5)
    await run_until(source, seen, 6)
    assert rewinds == [1]
    assert seen == [0.0, 1.0, 2.0, 3.0, 0.0, 1.0]
    assert source.now() == 1.5


async def test_empty_recording_does_not_spin() -> None:
    source = ReplaySource(recording([]))
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
