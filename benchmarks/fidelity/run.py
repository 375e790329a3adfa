"""Fidelity of kvtop's simulator against vLLM 0.33's real scheduler (the twin).

Run: ``python -m benchmarks.fidelity.run [--quick] [--workloads a,b] [--out DIR]``.

Both sides replay the same request list (arrival step, prompt token ids, max_tokens, output
length that ends in EOS), with the same pool, block size 16, max_num_seqs,
max_num_batched_tokens, max_model_len and prefix caching on. Both are stepped one engine step
at a time and sampled after each step: KV usage, running, waiting, cumulative preemptions
and cumulative prefix-cache hits/queries. The twin runs in a subprocess under the twin
interpreter (`$KVTOP_TWIN_PYTHON`, default `.venv-twin/bin/python`; see scripts/install-twin.sh)
because it registers process-global Prometheus collectors.

The simulator hashes blocks by a content key; here the key of a full prompt block is its 16
token ids, so prefix sharing (and hash chaining) is the twin's by construction.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.paths import REPO
from kvtop.sim.engine import Engine, EngineConfig, RequestSpec
from kvtop.sim.workloads import azure, mooncake
from twin.serve import twin_python

DRIVER = Path(__file__).with_name("twin_driver.py")
BLOCK = 16
VOCAB = 32000  # the twin's fake Llama; ids 0-2 are special (2 is EOS)
TWIN_MODEL_LEN = 8192  # the twin's config.json max_position_embeddings

Workload = dict[str, Any]
Step = dict[str, float]
SAMPLED = ("usage", "running", "waiting", "preemptions", "queries", "hits")


# -- workloads -------------------------------------------------------------------------


def _config(blocks: int, seqs: int, batched: int, model_len: int) -> dict[str, int]:
    return {"num_gpu_blocks": blocks, "block_size": BLOCK, "max_num_seqs": seqs,
            "max_num_batched_tokens": batched, "max_model_len": model_len}


def _request(step: int, prompt: list[int], max_tokens: int, output_len: int) -> dict[str, Any]:
    return {"step": step, "prompt": prompt, "max_tokens": max_tokens,
            "output_len": min(output_len, max_tokens)}


def _workload(name: str, config: dict[str, int], requests: list[dict[str, Any]]) -> Workload:
    return {"name": name, "config": config, "requests": requests, "seed": 0,
            "max_steps": 200_000}


def mixed(n: int) -> Workload:
    """The fixtures' healthy run: two 256-token system prompts, 2 arrivals/step."""
    rng = random.Random(0)  # the draws, in order, of the run behind the 0.33.0 fixtures
    systems = [[rng.randrange(3, VOCAB) for _ in range(256)] for _ in range(2)]
    requests = []
    for i in range(n):
        suffix = [rng.randrange(3, VOCAB) for _ in range(rng.randint(16, 400))]
        prompt = (rng.choice(systems) + suffix) if rng.random() < 0.5 else suffix
        out = rng.randint(16, 256)
        requests.append(_request(i // 2, prompt, out, out))
    return _workload("mixed", _config(600, 32, 1024, 4096), requests)


def pressure(n: int) -> Workload:
    """A small pool under bursts: four shared prefixes, EOS before max_tokens, preemptions."""
    rng = random.Random(1)
    systems = [[rng.randrange(3, VOCAB) for _ in range(rng.choice((128, 256, 384)))]
               for _ in range(4)]
    requests = []
    for i in range(n):
        user = [rng.randrange(3, VOCAB) for _ in range(rng.randint(8, 500))]
        prompt = rng.choice(systems) + user if rng.random() < 0.6 else user
        out = rng.randint(8, 400)
        max_tokens = out if rng.random() < 0.3 else min(2 * out, 2048 - len(prompt))
        requests.append(_request((i // 8) * 12, prompt, max_tokens, out))  # bursts of 8
    return _workload("pressure", _config(256, 24, 512, 2048), requests)


class TokenBook:
    """Turns workload block keys into token ids: one fixed random block per key."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.blocks: dict[object, list[int]] = {}

    def prompt(self, spec: RequestSpec) -> list[int]:
        tokens: list[int] = []
        for key in spec.prefix_keys[: spec.prompt_len // BLOCK]:
            if key not in self.blocks:
                self.blocks[key] = self.fresh(BLOCK)
            tokens += self.blocks[key]
        return tokens + self.fresh(spec.prompt_len - len(tokens))

    def fresh(self, n: int) -> list[int]:
        return [self.rng.randrange(3, VOCAB) for _ in range(n)]


def from_trace(name: str, specs: Iterable[RequestSpec], n: int, steps_per_s: float,
               config: dict[str, int]) -> Workload:
    """The first `n` trace requests that fit the model, arrival seconds -> engine steps."""
    book = TokenBook(2)
    model_len = config["max_model_len"]
    requests = []
    for spec in specs:
        if len(requests) == n:
            break
        if spec.prompt_len >= model_len - 16:
            continue
        max_tokens = min(spec.max_tokens, model_len - spec.prompt_len)
        requests.append(_request(round(spec.arrival * steps_per_s), book.prompt(spec),
                                 max_tokens, spec.output_len or max_tokens))
    return _workload(name, config, requests)


def mooncake_slice(n: int) -> Workload:
    """Mooncake conversation trace: 512-token hash ids scaled 1/16 -> 2 blocks of 16 each."""
    specs = mooncake(token_scale=1 / 16, spread=True)
    return from_trace("mooncake", specs, n, 25.0, _config(1500, 32, 1024, TWIN_MODEL_LEN))


def azure_slice(n: int) -> Workload:
    """Azure 2023 conversation trace (real arrivals, lengths halved), four 256-token prefixes."""
    specs = azure(token_scale=0.5, groups=4, system_prompt_len=256)
    return from_trace("azure", specs, n, 30.0, _config(600, 32, 1024, 4096))


WORKLOADS: dict[str, tuple[Callable[[int], Workload], int, int]] = {
    # name: (builder, requests, requests with --quick)
    "mixed": (mixed, 200, 60),
    "pressure": (pressure, 160, 60),
    "mooncake": (mooncake_slice, 400, 100),
    "azure": (azure_slice, 400, 100),
}


# -- the two sides ---------------------------------------------------------------------


def replay_sim(workload: Workload) -> list[Step]:
    """kvtop's Engine, stepped like the twin: arrivals of step k are added before step k."""
    c = workload["config"]
    engine = Engine(EngineConfig(
        num_gpu_blocks=c["num_gpu_blocks"], block_size=c["block_size"],
        max_num_seqs=c["max_num_seqs"], max_num_batched_tokens=c["max_num_batched_tokens"],
        max_model_len=c["max_model_len"]), created=0.0)
    requests = sorted(workload["requests"], key=lambda r: r["step"])
    trajectory: list[Step] = []
    i = 0
    while i < len(requests) or engine.has_work:
        while i < len(requests) and requests[i]["step"] <= len(trajectory):
            engine.add_request(_spec(requests[i]))
            i += 1
        engine.step()
        trajectory.append(_sample(engine))
        if len(trajectory) >= workload["max_steps"]:
            break
    return trajectory


def _spec(r: dict[str, Any]) -> RequestSpec:
    prompt = r["prompt"]
    keys = tuple(tuple(prompt[j:j + BLOCK]) for j in range(0, len(prompt) - BLOCK + 1, BLOCK))
    return RequestSpec(float(r["step"]), len(prompt), r["max_tokens"], r["output_len"], keys)


def _sample(engine: Engine) -> Step:
    stats = engine.stats
    return {"usage": engine.pool.usage(), "running": len(engine.running),
            "waiting": len(engine.waiting), "preemptions": stats.preemptions,
            "queries": stats.prefix_queries, "hits": stats.prefix_hits}


def replay_twin(workloads: list[Workload], python: Path | None = None,
                timeout: float = 600.0) -> list[list[Step]]:
    """All workloads in one twin subprocess (the vllm import alone takes 5-10 s)."""
    with tempfile.TemporaryDirectory(prefix="kvtop-fidelity-") as tmp:
        args: list[str] = []
        for k, workload in enumerate(workloads):
            src, dst = Path(tmp, f"w{k}.json"), Path(tmp, f"t{k}.json")
            src.write_text(json.dumps(workload))
            args += [str(src), str(dst)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([str(python or twin_python()), str(DRIVER), *args], env=env,
                              timeout=timeout, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"twin driver failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return [json.loads(Path(tmp, f"t{k}.json").read_text())["steps"]
                for k in range(len(workloads))]


# -- comparison ------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    workload: str
    requests: int
    usage_mae_pp: float
    usage_max_err_pp: float
    hit_rate_sim: float
    hit_rate_twin: float
    hit_rate_diff_pp: float
    preemptions_sim: int
    preemptions_twin: int
    preemption_ratio: float
    running_mae: float
    waiting_mae: float
    steps_sim: int
    steps_twin: int
    identical_steps: float  # fraction of steps where all sampled values agree exactly

    @property
    def meets_goals(self) -> bool:
        return self.usage_mae_pp <= 5.0 and abs(self.hit_rate_diff_pp) <= 3.0


def _padded(a: list[Step], b: list[Step]) -> Iterable[tuple[Step, Step]]:
    """Pairs by step index; the shorter run stays at its final (drained) state."""
    return ((a[min(k, len(a) - 1)], b[min(k, len(b) - 1)]) for k in range(max(len(a), len(b))))


def _hit_rate(step: Step) -> float:
    return step["hits"] / step["queries"] if step["queries"] else 0.0


def compare(workload: Workload, sim: list[Step], twin: list[Step]) -> Result:
    pairs = list(_padded(sim, twin))

    def mae(key: str) -> float:
        return sum(abs(s[key] - t[key]) for s, t in pairs) / len(pairs)

    usage_err = [abs(s["usage"] - t["usage"]) * 100 for s, t in pairs]
    p_sim, p_twin = int(sim[-1]["preemptions"]), int(twin[-1]["preemptions"])
    ratio = p_sim / p_twin if p_twin else (1.0 if p_sim == 0 else math.inf)
    return Result(
        workload=workload["name"], requests=len(workload["requests"]),
        usage_mae_pp=sum(usage_err) / len(usage_err), usage_max_err_pp=max(usage_err),
        hit_rate_sim=_hit_rate(sim[-1]), hit_rate_twin=_hit_rate(twin[-1]),
        hit_rate_diff_pp=(_hit_rate(sim[-1]) - _hit_rate(twin[-1])) * 100,
        preemptions_sim=p_sim, preemptions_twin=p_twin, preemption_ratio=ratio,
        running_mae=mae("running"), waiting_mae=mae("waiting"),
        steps_sim=len(sim), steps_twin=len(twin),
        identical_steps=sum(all(s[k] == t[k] for k in SAMPLED) for s, t in pairs) / len(pairs),
    )


def run(names: list[str], quick: bool, out: Path | None = None,
        python: Path | None = None) -> list[Result]:
    workloads = [WORKLOADS[n][0](WORKLOADS[n][2 if quick else 1]) for n in names]
    twins = replay_twin(workloads, python)
    results = []
    for workload, twin in zip(workloads, twins, strict=True):
        sim = replay_sim(workload)
        results.append(compare(workload, sim, twin))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{workload['name']}.json").write_text(json.dumps({"sim": sim, "twin": twin}))
    return results


def table(results: list[Result]) -> str:
    head = ("| workload | requests | usage MAE (pp) | max usage err (pp) | hit rate sim / twin | "
            "hit diff (pp) | preemptions sim / twin (ratio) | running MAE | waiting MAE | "
            "steps sim / twin | identical steps | goals |")
    rows = [head, "|" + "---|" * 12]
    for r in results:
        rows.append(
            f"| {r.workload} | {r.requests} | {r.usage_mae_pp:.2f} | {r.usage_max_err_pp:.1f} | "
            f"{r.hit_rate_sim:.1%} / {r.hit_rate_twin:.1%} | {r.hit_rate_diff_pp:+.2f} | "
            f"{r.preemptions_sim} / {r.preemptions_twin} ({r.preemption_ratio:.2f}) | "
            f"{r.running_mae:.2f} | {r.waiting_mae:.2f} | {r.steps_sim} / {r.steps_twin} | "
            f"{r.identical_steps:.1%} | {'met' if r.meets_goals else 'MISSED'} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests per workload")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    ap.add_argument("--out", type=Path, help="write per-step trajectories and results here")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    args = ap.parse_args()
    if not twin_python().exists():
        sys.exit(f"no twin interpreter at {twin_python()}: run scripts/install-twin.sh")
    results = run(args.workloads.split(","), args.quick, args.out)
    if args.out is not None:
        (args.out / "results.json").write_text(json.dumps([asdict(r) for r in results]))
    print(json.dumps([asdict(r) for r in results], indent=1) if args.json else table(results))


if __name__ == "__main__":
    main()
