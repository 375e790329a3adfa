"""Leak-evaluation scenarios and their recordings, made without HTTP in simulated time.

A scenario drives kvtop's simulator (or, in `twin_recordings.py`, vLLM 0.33's own
scheduler) and every `interval_s` simulated seconds writes its `/metrics` text, exactly as
served, as one scrape of a kvtop recording (`t` = a fixed epoch + simulated seconds). The
ground truth of each scrape (leaked blocks, used blocks, running, waiting) goes to a JSON
file next to it.

Lumpy leaks (`lumps`) are given directly: at each time, the next requests to end keep
their blocks until that fraction of the pool has leaked, whole requests at once.

Leak sizes of the steady leaks are calibrated, not guessed: until `leak_at_s` the server is
healthy and the simulator counts the requests that end the way the leak will hit (finished,
or aborted) and the blocks each held when it ended. At `leak_at_s` the leak fraction is set
so that fraction x ending rate x blocks per request fills the pool in `leak_fill_h` hours.
Shared prefix blocks are counted once in the truth, so the measured fill time can be longer;
the table reports the measured one.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvtop.collect.target import Scrape, Target
from kvtop.sim.engine import EngineConfig, Request, RequestSpec
from kvtop.sim.exposition import render
from kvtop.sim.faults import Fault
from kvtop.sim.simulation import Simulation
from kvtop.sim.workloads import make_workload
from kvtop.store.recording import RecordingWriter

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: simulated second 0 as unix time
MODEL = "sim-llama-3-8b"
WARMUP_S = 300.0  # simulated before the recording starts: monitoring joins a running server

Load = Literal["continuous", "idle gaps"]
LeakOn = Literal["finished", "aborted"]


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str  # "synthetic", "mooncake", "azure" or "twin"
    load: Load  # as designed; the table also shows the share of idle scrapes seen
    what: str  # one line for the table
    params: dict[str, Any] = field(default_factory=dict)  # workload (or twin) parameters
    blocks: int = 4000
    max_num_seqs: int = 64
    duration_s: float = 3600.0  # recorded, after WARMUP_S
    interval_s: float = 10.0
    leak_fill_h: float | None = None  # None: healthy
    leak_at_s: float = 1200.0  # recording time the leak starts
    leak_on: LeakOn = "finished"
    restart_at: tuple[float, ...] = ()  # recording times
    # (recording time, fraction of the pool): the next requests to end leak that much at once
    lumps: tuple[tuple[float, float], ...] = ()
    # the rate (synthetic) or rate_scale (traces) from .. to, linear over the run
    ramp: tuple[float, float] | None = None
    # served as vLLM 0.8.3–0.10.1 does: the null block counts as used (idle reads 1/N)
    null_block: bool = False
    quick: bool = False  # part of the --quick subset

    @property
    def leaking(self) -> bool:
        return self.leak_fill_h is not None or bool(self.lumps)


class EvalSimulation(Simulation):
    """A Simulation whose leak hits only one kind of ending (finished or aborted requests),
    and which counts those endings and the blocks they held, to calibrate the leak."""

    def __init__(self, config: EngineConfig, requests: Iterable[RequestSpec],
                 faults: Iterable[Fault], *, seed: int, leak_on: LeakOn) -> None:
        self.leak_on = leak_on
        self.ended = 0  # requests that ended the way the leak hits
        self.ended_blocks = 0  # blocks they held when they ended
        super().__init__(config, requests, faults, seed=seed,
                         wall_clock=lambda: EPOCH + self._now())
        self._hook()

    def _now(self) -> float:
        return self.clock if hasattr(self, "engine") else 0.0

    def restart(self) -> None:
        super().restart()
        self._hook()

    def _hook(self) -> None:
        engine = self.engine
        finish = engine._finish

        def hooked(req: Request, reason: str) -> None:
            eligible = (reason == "abort") == (self.leak_on == "aborted")
            if eligible:
                self.ended += 1
                # Blocks shared with live requests (a common prefix) leak once, not per request.
                self.ended_blocks += sum(b.ref_cnt == 1
                                         for b in engine.kv.req_blocks.get(req.req_id, ()))
            frac, lump = engine.leak_frac, engine.lump_blocks
            if not eligible:
                engine.leak_frac = engine.lump_blocks = 0.0
            try:
                finish(req, reason)
            finally:
                engine.leak_frac = frac
                if not eligible:
                    engine.lump_blocks = lump

        engine._finish = hooked  # type: ignore[method-assign]


def ramped(scenario: Scenario, rate: tuple[float, float], seed: int) -> Iterator[RequestSpec]:
    """Arrivals whose rate (synthetic) or rate scale (a trace) moves linearly from rate[0]
    to rate[1] over the run: the workload at the top rate, thinned."""
    top, duration_s = max(rate), WARMUP_S + scenario.duration_s
    key = "rate" if scenario.source == "synthetic" else "rate_scale"
    rng = random.Random(seed + 7)
    for spec in make_workload(scenario.source, seed=seed, **{**scenario.params, key: top}):
        now = rate[0] + (rate[1] - rate[0]) * min(spec.arrival / duration_s, 1.0)
        if rng.random() < now / top:
            yield spec


def workload(scenario: Scenario, seed: int) -> Iterator[RequestSpec]:
    if scenario.ramp is not None:
        return ramped(scenario, scenario.ramp, seed)
    return make_workload(scenario.source, seed=seed, **scenario.params)


@dataclass
class TruthLog:
    """Ground truth per scrape, written as JSON next to the recording."""

    scenario: Scenario
    leak_start_t: float | None = None
    leak_frac: float = 0.0
    calibration: dict[str, float] = field(default_factory=dict)
    scrapes: list[list[float]] = field(default_factory=list)  # t, leaked, used, running, waiting

    def write(self, path: Path) -> None:
        doc = {"scenario": self.scenario.name, "pool": self.scenario.blocks,
               "leak_start_t": self.leak_start_t, "leak_fill_h_target": self.scenario.leak_fill_h,
               "leak_on": self.scenario.leak_on if self.scenario.leaking else None,
               "leak_frac": self.leak_frac, "calibration": self.calibration,
               "columns": ["t", "leaked_blocks", "used_blocks", "running", "waiting"],
               "scrapes": self.scrapes}
        path.write_text(json.dumps(doc, separators=(",", ":")))


def leak_fraction(ended: int, blocks: int, seconds: float, pool: int, fill_h: float) -> float:
    """The fraction of endings to leak so that the pool fills in `fill_h` hours."""
    if not ended or not blocks or seconds <= 0:
        raise ValueError("no requests ended before the leak: cannot calibrate it")
    blocks_per_s = ended / seconds * (blocks / ended)
    return min(1.0, pool / (fill_h * 3600) / blocks_per_s)


def generate(scenario: Scenario, out: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write `<name>.jsonl.gz` (the recording) and `<name>.truth.json`; return both paths."""
    config = EngineConfig(num_gpu_blocks=scenario.blocks, max_num_seqs=scenario.max_num_seqs)
    faults = [Fault(WARMUP_S + at, "restart") for at in scenario.restart_at]
    faults += [Fault(WARMUP_S + at, "lump", frac * scenario.blocks) for at, frac in scenario.lumps]
    sim = EvalSimulation(config, workload(scenario, seed), faults, seed=seed,
                         leak_on=scenario.leak_on)
    target = Target(url=f"sim://{scenario.name}")
    rec_path, truth_path = out / f"{scenario.name}.jsonl.gz", out / f"{scenario.name}.truth.json"
    truth = TruthLog(scenario)
    if scenario.lumps:
        truth.leak_start_t = EPOCH + WARMUP_S + min(at for at, _ in scenario.lumps)
    sim.advance_to(WARMUP_S)
    mark = (WARMUP_S, sim.ended, sim.ended_blocks)
    with RecordingWriter(rec_path, interval_s=scenario.interval_s, targets=[target]) as writer:
        t = WARMUP_S
        while t < WARMUP_S + scenario.duration_s:
            t += scenario.interval_s
            sim.advance_to(t)
            due = t >= WARMUP_S + scenario.leak_at_s
            if scenario.leak_fill_h is not None and truth.leak_start_t is None and due:
                _start_leak(sim, scenario, truth, mark, t)
            body = render(sim.engine, model_name=MODEL)
            version = None
            if scenario.null_block:
                body, version = with_null_block(body, sim.engine.pool.num_gpu_blocks), "0.10.1"
            writer.write(Scrape(target, EPOCH + t, body=body, version=version))
            now = sim.truth()
            truth.scrapes.append([EPOCH + t, now.leaked_blocks, now.used_blocks, now.running,
                                  now.waiting])
    truth.write(truth_path)
    return rec_path, truth_path


def with_null_block(body: str, num_gpu_blocks: int) -> str:
    """The usage gauge as vLLM 0.8.3–0.10.1 reports it: (used + the null block) / N."""
    lines = []
    for line in body.splitlines():
        if line.startswith("vllm:kv_cache_usage_perc{"):
            labels, value = line.rsplit(" ", 1)
            used = float(value) * (num_gpu_blocks - 1)
            line = f"{labels} {(used + 1) / num_gpu_blocks!r}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _start_leak(sim: EvalSimulation, scenario: Scenario, truth: TruthLog,
                mark: tuple[float, int, int], t: float) -> None:
    t0, ended0, blocks0 = mark
    ended, blocks = sim.ended - ended0, sim.ended_blocks - blocks0
    assert scenario.leak_fill_h is not None
    frac = leak_fraction(ended, blocks, t - t0, scenario.blocks, scenario.leak_fill_h)
    sim.inject("leak", frac)
    truth.leak_start_t, truth.leak_frac = EPOCH + t, frac
    truth.calibration = {"ended_per_s": ended / (t - t0), "blocks_per_ended": blocks / ended}


def read_truth(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())

