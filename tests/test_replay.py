"""Replay delivers a recording's scrapes on the recording clock, and pauses, steps, seeks."""

from __future__ import annotations

import asyncio
import time

from kvtop.collect.target import Scrape, Target
from kvtop.store.recording import Recording
from kvtop.store.replay import ReplaySource

TARGET = Target.from_spec("127.0.0.1:8000")


def recording(times: list[float]) -> Recording:
    return Recording({"format": "kvtop-recording", "version": 1, "interval_s": 1.0},
                     [Scrape(TARGET, t, body=f"x {t}\n") for t in times])


async def run_until(source: ReplaySource, seen: list[float], count: int,
                    timeout: float = 5.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(lambda s: seen.append(s.t), stop=stop))
    deadline = time.monotonic() + timeout
    while len(seen) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    stop.set()
    await task


async def test_plays_in_order_at_speed() -> None:
    source = ReplaySource(recording([100.0, 102.0, 101.0, 104.0]), speed=20.0)
    seen: list[float] = []
    started = time.monotonic()
    await run_until(source, seen, 4)
    elapsed = time.monotonic() - started
    assert seen == [100.0, 101.0, 102.0, 104.0]
    assert 0.15 <= elapsed < 1.5  # 4 recorded seconds at 20x
    assert source.now() == 104.0 and source.finished


async def test_pause_and_step() -> None:
    source = ReplaySource(recording([0.0, 10.0, 20.0]), speed=1.0)
    source.toggle_pause()
    seen: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(lambda s: seen.append(s.t), stop=stop))
    await asyncio.sleep(0.1)
    assert seen == [0.0]  # the scrape at the start position only
    source.step()
    await asyncio.sleep(0.1)
    assert seen == [0.0, 10.0] and source.now() == 10.0
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
    seen: list[float] = []
    await run_until(source, seen, 1, timeout=0.2)
    assert seen == [] and source.finished
