"""Replay a fidelity workload through vLLM 0.33's real scheduler (the twin, level A).

Runs under the twin interpreter only (`.venv-twin/bin/python`), with
PYTHONPATH=../shared/twin so that `twin_probe` (which sets the CPU/offline environment
before importing vllm) provides the real Scheduler, KVCacheManager and block hasher.

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

import twin_probe  # sets VLLM_TARGET_DEVICE=cpu etc. before importing vllm
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

EOS = twin_probe.EOS
VOCAB = twin_probe.VOCAB


class Driver:
    """The twin's scheduler with a fake model that ends each request at its planned length."""

    def __init__(self, config: dict[str, int], seed: int) -> None:
        self.twin = twin_probe.Twin(
            num_blocks=config["num_gpu_blocks"],
            max_num_seqs=config["max_num_seqs"],
            max_num_batched_tokens=config["max_num_batched_tokens"],
            max_model_len=config["max_model_len"],
            seed=seed,
        )
        self.scheduler = self.twin.scheduler
        self.rng = random.Random(seed)
        self.output_len: dict[str, int] = {}
        self.totals = {"preemptions": 0, "queries": 0, "hits": 0, "finished": 0}

    def add(self, rid: str, spec: dict[str, Any]) -> None:
        # stop_token_ids, not eos_token_id: with no tokenizer nothing sets the latter.
        params = SamplingParams(max_tokens=spec["max_tokens"], stop_token_ids=[EOS],
                                detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        ecr = EngineCoreRequest(
            request_id=rid, prompt_token_ids=spec["prompt"], mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=time.time(),
            lora_request=None, cache_salt=None, data_parallel_rank=None, external_req_id=rid,
        )
        self.output_len[rid] = spec["output_len"]
        self.scheduler.add_request(Request.from_engine_core_request(ecr,
                                                                    self.twin.block_hasher))

    def sample(self, rid: str) -> list[int]:
        req = self.scheduler.requests[rid]
        if req.is_prefill_chunk:
            return []  # a partial prefill samples nothing
        if req.num_output_tokens + 1 == self.output_len[rid] < req.max_tokens:
            return [EOS]
        return [self.rng.randrange(3, VOCAB)]

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        req_ids = list(so.num_scheduled_tokens)
        return ModelRunnerOutput(req_ids=req_ids,
                                 req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=[self.sample(r) for r in req_ids])

    def step(self) -> dict[str, float]:
        so = self.scheduler.schedule()
        outputs = self.scheduler.update_from_output(so, self.execute(so))
        self.totals["preemptions"] += len(so.preempted_req_ids or ())
        for outs in outputs.values():
            self.totals["finished"] += sum(1 for o in outs.outputs if o.finished)
            if outs.scheduler_stats is not None:
                self.totals["queries"] += outs.scheduler_stats.prefix_cache_stats.queries
                self.totals["hits"] += outs.scheduler_stats.prefix_cache_stats.hits
        running, waiting = self.scheduler.get_request_counts()
        pool = self.scheduler.kv_cache_manager.block_pool
        return {"usage": pool.get_usage(), "running": running, "waiting": waiting,
                "scheduled": so.total_num_scheduled_tokens, **self.totals}


def replay(workload: dict[str, Any]) -> list[dict[str, float]]:
    driver = Driver(workload["config"], workload.get("seed", 0))
    requests = sorted(enumerate(workload["requests"]), key=lambda p: p[1]["step"])
    trajectory: list[dict[str, float]] = []
    i = 0
    while i < len(requests) or driver.scheduler.has_unfinished_requests():
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
            json.dump({"vllm": twin_probe.vllm.__version__,
                       "seconds": time.perf_counter() - t0, "steps": trajectory}, f)


if __name__ == "__main__":
    main()
