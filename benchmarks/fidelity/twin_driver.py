"""Replay a fidelity workload through vLLM 0.33's real scheduler (twin/scheduler.py).

Runs under the twin interpreter only (`.venv-twin/bin/python`), with the checkout on
PYTHONPATH so that `twin.scheduler` (which sets the CPU/offline environment before importing
vllm) provides the real Scheduler, KVCacheManager and block hasher.

    python twin_driver.py WORKLOAD.json TRAJECTORY.json [WORKLOAD.json TRAJECTORY.json ...]

The workload JSON is written by `run.py`; the trajectory holds one record per engine step
(schedule -> fake execute -> update_from_output), taken after the step.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from twin.model import EOS_TOKEN_ID, FIRST_TEXT_TOKEN_ID, VOCAB_SIZE
from twin.scheduler import VLLM_VERSION, Request, SchedulerTwin


class Driver:
    """The twin's scheduler with a fake model that ends each request at its planned length."""

    def __init__(self, config: dict[str, int], seed: int) -> None:
        self.twin = SchedulerTwin(
            num_blocks=config["num_gpu_blocks"],
            max_num_seqs=config["max_num_seqs"],
            max_num_batched_tokens=config["max_num_batched_tokens"],
            max_model_len=config["max_model_len"],
            seed=seed,
        )
        self.rng = random.Random(seed)
        self.output_len: dict[str, int] = {}
        self.totals = {"preemptions": 0, "queries": 0, "hits": 0, "finished": 0}

    def add(self, rid: str, spec: dict[str, Any]) -> None:
        self.output_len[rid] = spec["output_len"]
        self.twin.add_request(spec["prompt"], spec["max_tokens"], request_id=rid)

    def sample(self, request: Request) -> list[int]:
        if request.is_prefill_chunk:
            return []  # a partial prefill samples nothing
        if request.num_output_tokens + 1 == self.output_len[request.request_id] \
                < request.max_tokens:
            return [EOS_TOKEN_ID]
        return [self.rng.randrange(FIRST_TEXT_TOKEN_ID, VOCAB_SIZE)]

    def step(self) -> dict[str, float]:
        report = self.twin.step(self.sample)
        self.totals["preemptions"] += report.preempted
        self.totals["finished"] += report.finished
        self.totals["queries"] += report.prefix_queries
        self.totals["hits"] += report.prefix_hits
        running, waiting = self.twin.counts()
        return {"usage": self.twin.usage(), "running": running, "waiting": waiting,
                "scheduled": report.scheduled_tokens, **self.totals}


def replay(workload: dict[str, Any]) -> list[dict[str, float]]:
    driver = Driver(workload["config"], workload.get("seed", 0))
    requests = sorted(enumerate(workload["requests"]), key=lambda p: p[1]["step"])
    trajectory: list[dict[str, float]] = []
    i = 0
    while i < len(requests) or driver.twin.has_work():
        while i < len(requests) and requests[i][1]["step"] <= len(trajectory):
            driver.add(f"r{requests[i][0]}", requests[i][1])
            i += 1
        trajectory.append(driver.step())
        if len(trajectory) >= workload["max_steps"]:
            break
    return trajectory


def main() -> None:
    paths = sys.argv[1:]
    for src, dst in zip(paths[::2], paths[1::2], strict=True):
        with open(src) as f:
            workload = json.load(f)
        t0 = time.perf_counter()
        trajectory = replay(workload)
        with open(dst, "w") as f:
            json.dump({"vllm": VLLM_VERSION,
                       "seconds": time.perf_counter() - t0, "steps": trajectory}, f)


if __name__ == "__main__":
    main()
