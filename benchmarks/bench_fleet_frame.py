"""How long the app takes to draw a frame of a 500-engine fleet, and to answer sort and filter.

500 targets, each with a real :class:`TargetTracker` fed two real vLLM /metrics bodies
(fixtures, with running / waiting / KV use varied per host), some down or stale, a few with a
WATCH or LEAK verdict. The real :class:`KvtopApp` runs headless (``App.run_test``) over them;
no scrape arrives during the measurement, so only UI work is timed:

* frame: new values for every engine (as after one poll), then the app's draw, Textual's
  message processing, layout and the compositor's paint of the screen;
* frame CPU: the CPU time the process spent on that frame (on a loaded machine the wall
  time also holds the waits for a core; this does not);
* draw: the app's own part of that (rows, table, panel, summary);
* sort ``o``, filter (``/`` then one key), page down: key press to painted screen; this
  includes the test pilot's own idle waits, measured alone as "no-op key" (an unbound key).

Goals: a frame for 500 rows renders in under 50 ms (issue 6); its CPU is at most 30 ms
(issue 26).

    .venv/bin/python -m benchmarks.bench_fleet_frame [--engines 500] [--frames 20] [--quick]

``--quick``: 50 engines, 3 frames, 80x24 only: a few seconds' smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

from textual.pilot import Pilot

from benchmarks.paths import METRICS as FIXTURES
from benchmarks.quick import parse_args, quick_option
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from kvtop.derive.verdicts import LeakVerdict
from kvtop.ui.app import AppConfig, KvtopApp

BODIES = ("vllm-0.33.0-v1-twin-under-load.txt", "vllm-0.33.0-v1-twin-idle.txt",
          "vllm-0.10.1.1-v1-twin-under-load.txt")
T0 = 1_767_225_600.0
GAUGES = {
    "running": re.compile(r"^(vllm:num_requests_running\{[^}]*\}) \S+$", re.M),
    "waiting": re.compile(r"^(vllm:num_requests_waiting\{[^}]*\}) \S+$", re.M),
    "kv": re.compile(r"^(vllm:(?:gpu_)?kv_cache_usage_perc\{[^}]*\}) \S+$", re.M),
}
LEAK = LeakVerdict("leak", "idle floor rose 2100 blocks in 30m", 2140.0, 4200.0, 4.3)
WATCH = LeakVerdict("watch", "floor rising slowly", 300.0, 600.0, 30.0)


class IdleSource:
    """Delivers nothing: the trackers are filled before the app starts."""

    interval_s = 1.0

    async def run(self, on_scrape: Callable[[Scrape], Awaitable[None] | None], *,
                  stop: asyncio.Event) -> None:
        await stop.wait()


def _varied(body: str, rng: random.Random) -> str:
    values = {"running": f"{rng.randint(0, 64)}.0", "waiting": f"{rng.choice([0, 0, 0, 3, 40])}.0",
              "kv": f"{rng.random():.4f}"}
    for name, pattern in GAUGES.items():
        body = pattern.sub(lambda m, v=values[name]: f"{m.group(1)} {v}", body)
    return body


def build_trackers(count: int, seed: int = 0) -> dict[str, TargetTracker]:
    """``count`` trackers fed real bodies twice (so rates exist); ~4 % down or stale."""
    rng = random.Random(seed)
    bodies = [(FIXTURES / name).read_text() for name in BODIES]
    trackers: dict[str, TargetTracker] = {}
    for i in range(count):
        target = Target.from_spec(f"10.{i // 200}.{i % 200}.{i % 7 + 1}:8000")
        tracker = TargetTracker(target)
        body = bodies[i % len(bodies)]
        tracker.update(read_scrape(Scrape(target, T0, _varied(body, rng))))
        tracker.update(read_scrape(Scrape(target, T0 + 1, _varied(body, rng))))
        roll = rng.random()
        if roll < 0.02:
            tracker.update(Scrape(target, T0 + 90, failure="down", error="connection refused"))
        elif roll < 0.04:
            tracker.update(Scrape(target, T0 + 2, failure="timeout", error="timed out"))
        elif roll < 0.05:
            tracker.state.engines[0].leak = LEAK
        elif roll < 0.07:
            tracker.state.engines[0].leak = WATCH
        trackers[target.url] = tracker
    return trackers


def new_values(trackers: dict[str, TargetTracker], rng: random.Random, t: float) -> None:
    """What one poll does to the states, without parsing: every engine's numbers move."""
    for tracker in trackers.values():
        state = tracker.state
        if state.status != "up":
            continue
        state.engines = [
            dataclasses.replace(s, t=t, running=float(rng.randint(0, 64)),
                                kv_usage=rng.random(), generation_tps=rng.uniform(0, 3000))
            for s in state.engines
        ]
        state.last_good_t = state.last_attempt_t = t


async def painted(pilot: Pilot[None]) -> None:
    """Let the app handle what is queued, then lay out and paint now (not at the next tick)."""
    await pilot._wait_for_screen()
    pilot.app.screen._on_timer_update()


async def timed(action: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await action()
    return 1000 * (time.perf_counter() - start)


async def measure(count: int, frames: int, size: tuple[int, int]) -> dict[str, list[float]]:
    trackers = build_trackers(count)
    clock = [T0 + 2]
    config = AppConfig(
        targets=[t.state.target for t in trackers.values()], no_gpu=True,
        source_factory=lambda cfg: IdleSource(),
        tracker_factory=lambda target: trackers[target.url],
        clock=lambda: clock[0],
    )
    app = KvtopApp(config)
    times: dict[str, list[float]] = {"first frame": [], "frame": [], "frame CPU": [], "draw": [],
                                      "sort o": [], "filter key": [], "page down": [],
                                      "no-op key": []}
    rng = random.Random(1)
    async with app.run_test(size=size) as pilot:
        times["first frame"].append(await timed(lambda: painted(pilot)))
        for i in range(frames):
            clock[0] += 1
            new_values(trackers, rng, clock[0])
            start, cpu = time.perf_counter(), time.process_time()
            app._draw(force=True)
            times["draw"].append(1000 * (time.perf_counter() - start))
            await painted(pilot)
            times["frame"].append(1000 * (time.perf_counter() - start))
            times["frame CPU"].append(1000 * (time.process_time() - cpu))
            if i % 4 == 0:
                times["page down"].append(await timed(lambda: _press(pilot, "pagedown")))
                times["no-op key"].append(await timed(lambda: _press(pilot, "x")))
        for _ in range(6):
            times["sort o"].append(await timed(lambda: _press(pilot, "o")))
        await _press(pilot, "slash")
        for key in "10.1":
            times["filter key"].append(await timed(lambda k=key: _press(pilot, k)))
    return times


async def _press(pilot: Pilot[None], key: str) -> None:
    await pilot.press(key)
    await painted(pilot)


def report(times: dict[str, list[float]], count: int, size: tuple[int, int]) -> str:
    lines = [f"kvtop fleet view, {count} engines, {size[0]}×{size[1]}, headless",
             "", "| step | median | max | n |", "|---|---:|---:|---:|"]
    for step, values in times.items():
        lines.append(f"| {step} | {statistics.median(values):.1f} ms | {max(values):.1f} ms"
                     f" | {len(values)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=500)
    parser.add_argument("--frames", type=int, default=20)
    quick_option(parser, engines=50, frames=3)
    args = parse_args(parser)
    for size in ((80, 24),) if args.quick else ((160, 48), (80, 24)):
        print(report(asyncio.run(measure(args.engines, args.frames, size)), args.engines, size))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
