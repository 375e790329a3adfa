"""Leak-evaluation run of vLLM 0.33's real scheduler and stat loggers (the twin, level A).

Runs under the twin interpreter only, with the checkout on PYTHONPATH (`twin.scheduler` sets
the CPU/offline environment before importing vllm), and always as a subprocess: vLLM registers
process-global Prometheus collectors.

    python twin_driver.py SPEC.json OUT.jsonl

Time is step-indexed (`step_s` simulated seconds per engine step). Requests arrive as a
Poisson process in that time, continuously or in bursts with idle gaps; while nothing is
running or waiting the engine does not step (like vLLM's idle engine core) and the clock
jumps to the next arrival. A spec may instead list its requests (`requests`: [arrival s,
prompt tokens, max tokens, system prompt index or -1]), for the never-idle benchmark's
mixes of conversations and long background jobs (`never_idle.py`). Every `interval_s` one
line goes to OUT: the `/metrics` text that vLLM's own PrometheusStatLogger exposes, plus the
ground truth. The leak is twin/leak.py's: `KVCacheManager.free` skips a fraction of finished
requests, calibrated at `leak_at_s` from the requests finished so far so that the pool would
fill in `leak_fill_h` hours; or, at each of `lumps` ([simulated s, blocks]), every finished
request leaks until that many blocks have.
"""

from __future__ import annotations

import json
import math
import random
import sys
from typing import Any

from twin.leak import FreeLeak
from twin.model import FIRST_TEXT_TOKEN_ID, VOCAB_SIZE
from twin.scheduler import SchedulerTwin


def arrivals(spec: dict[str, Any], rng: random.Random) -> list[float]:
    """Arrival times (s): Poisson at `rate`, or `rate` x factor during bursts."""
    times, t = [], 0.0
    rate, burst, factor = spec["rate"], spec.get("burst_len"), spec.get("burst_factor", 3.0)
    while t < spec["duration_s"]:
        if burst is None:
            t += rng.expovariate(rate)
            times.append(t)
            continue
        end = t + burst
        while (t := t + rng.expovariate(rate * factor)) < end:
            times.append(t)
        t = end + burst * (factor - 1)
    return times


def request(rng: random.Random, systems: list[list[int]], shared_frac: float
            ) -> tuple[list[int], int]:
    suffix = [rng.randrange(FIRST_TEXT_TOKEN_ID, VOCAB_SIZE) for _ in range(rng.randint(16, 400))]
    prompt = rng.choice(systems) + suffix if rng.random() < shared_frac else suffix
    return prompt, rng.randint(16, 256)


def listed(entry: list[Any], rng: random.Random, systems: list[list[int]]
           ) -> tuple[list[int], int]:
    """One of the spec's own requests ([arrival, prompt tokens, max tokens, system prompt
    index or -1]) as (prompt, max tokens), with random token ids after the system prompt."""
    _, prompt_len, max_tokens, group = entry
    prefix = systems[group] if group >= 0 else []
    suffix = max(1, prompt_len - len(prefix))
    return prefix + [rng.randrange(FIRST_TEXT_TOKEN_ID, VOCAB_SIZE)
                     for _ in range(suffix)], max_tokens


def run(spec: dict[str, Any], out: Any) -> None:
    rng = random.Random(spec["seed"])
    twin = SchedulerTwin(num_blocks=spec["blocks"], max_num_seqs=spec["max_num_seqs"],
                         max_num_batched_tokens=spec.get("max_num_batched_tokens", 1024),
                         seed=spec["seed"])
    leak = FreeLeak(seed=spec["seed"] + 1).install()
    leak.lump_slack = spec.get("lump_slack")
    systems = [[rng.randrange(FIRST_TEXT_TOKEN_ID, VOCAB_SIZE)
                for _ in range(spec.get("system_len", 256))] for _ in range(2)]
    queue = spec.get("requests") or [[t] for t in arrivals(spec, rng)]
    arrived = 0
    step_s, interval = spec["step_s"], spec["interval_s"]
    t = next_scrape = 0.0
    mark: tuple[float, int] | None = None
    lumps = sorted(spec.get("lumps", []))  # [simulated s, blocks]: whole requests leak at once
    while t < spec["duration_s"]:
        while arrived < len(queue) and queue[arrived][0] <= t:
            entry = queue[arrived]
            twin.add_request(*(listed(entry, rng, systems) if len(entry) > 1
                               else request(rng, systems, spec.get("shared_frac", 0.5))))
            arrived += 1
        if twin.has_work():
            twin.step()
            t += step_s
        else:  # an idle engine does not step; jump to the next arrival or scrape
            upcoming = queue[arrived][0] if arrived < len(queue) else math.inf
            t = max(t, min(upcoming, next_scrape))
        if mark is None and t >= spec["warmup_s"]:
            mark = (t, leak.ended_blocks)
        if spec.get("leak_fill_h") and leak.fraction == 0 and t >= spec["leak_at_s"] and mark:
            leak.fraction = _calibrate(spec, leak, mark, t)
            out.write(json.dumps({"leak_start_s": t, "leak_frac": leak.fraction}) + "\n")
        if lumps and t >= lumps[0][0]:
            if len(lumps) == len(spec["lumps"]):  # the first lump starts the leak
                out.write(json.dumps({"leak_start_s": t, "leak_frac": 0.0}) + "\n")
            leak.lump_blocks += lumps.pop(0)[1]
        if t >= next_scrape:
            if next_scrape >= spec["warmup_s"]:
                _scrape(twin, leak, next_scrape, out)
            next_scrape += interval


def _calibrate(spec: dict[str, Any], leak: FreeLeak, mark: tuple[float, int], t: float) -> float:
    t0, blocks0 = mark
    blocks_per_s = (leak.ended_blocks - blocks0) / (t - t0)
    return min(1.0, spec["blocks"] / (spec["leak_fill_h"] * 3600) / max(blocks_per_s, 1e-9))


def _scrape(twin: SchedulerTwin, leak: FreeLeak, t: float, out: Any) -> None:
    running, waiting = twin.counts()
    leaked = leak.leaked_blocks(twin.scheduler.kv_cache_manager, twin.scheduler.requests)
    out.write(json.dumps({"t": t, "body": twin.metrics_text(), "leaked": leaked,
                          "used": twin.used_blocks(), "running": running,
                          "waiting": waiting}) + "\n")


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    with open(sys.argv[2], "w") as out:
        run(spec, out)


if __name__ == "__main__":
    main()
