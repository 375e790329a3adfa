"""`kvtop baseline` and `kvtop compare` against real `vllm serve` twins (0.33.0, fake
executor): a baseline of one pool size (`--num-gpu-blocks-override`) compared with a run of
the same load on a quarter of it names the pool change first and flags the fuller pool and
the queue as worse; the probe, sent to vLLM's OpenAI API, falls back to token ids (the twin
has no tokenizer) and is stored.

Both twins are loaded the same way (token-id completions, 16 in flight, for the whole run)
and watched for 6 minutes at once: the baseline saved live on the larger pool while the
smaller pool is recorded, then `kvtop compare --replay` judges the recording.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.twin.client import SUMMARY, complete, make_prompts, wait_until_busy
from twin.serve import TwinServer, TwinSpec

if TYPE_CHECKING:
    from tests.twin.conftest import TwinSetup

BIG, SMALL = 800, 200  # --num-gpu-blocks-override of the baseline's pool and the run's
DURATION = "6m"  # six per-minute values a side: enough for the rank test to speak
CONCURRENCY = 16


@dataclass(frozen=True)
class OverrideSpec(TwinSpec):
    """A twin whose pool size is set with vLLM's own `--num-gpu-blocks-override`."""

    override: int = 0

    def args(self, model_dir: Path, port: int) -> list[str]:
        return [*super().args(model_dir, port), "--num-gpu-blocks-override",
                str(self.override)]


class SteadyLoad:
    """`CONCURRENCY` threads sending token-id completions back to back until stopped."""

    def __init__(self, base_url: str, seed: int) -> None:
        self.base_url, self.seed = base_url, seed
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._worker, args=(i,), daemon=True)
                        for i in range(CONCURRENCY)]

    def _worker(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        while not self.stop.is_set():
            (prompt,) = make_prompts(rng, 1, shared_frac=0.5)
            try:
                complete(self.base_url, prompt, rng.randint(64, 256))
            except Exception as error:  # counted; the test says how many
                self.errors.append(repr(error))

    def __enter__(self) -> SteadyLoad:
        for thread in self.threads:
            thread.start()
        wait_until_busy(self.base_url)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=150)


@pytest.fixture(scope="module")
def twins(twin_setup: TwinSetup) -> Iterator[tuple[TwinServer, TwinServer]]:
    servers = [TwinServer.launch(f"baseline-{blocks}", OverrideSpec(
        num_blocks=1000, step_delay_s=0.01, max_model_len=2048, override=blocks),
        twin_setup.python,
        twin_setup.model_dir, twin_setup.work) for blocks in (BIG, SMALL)]
    try:
        for server in servers:
            server.wait_ready()
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


async def kvtop(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 900)
    return proc.returncode or 0, out.decode(), err.decode()


async def watch_both(big: TwinServer, small: TwinServer, env: dict[str, str],
                     recording: Path) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    return await asyncio.gather(
        kvtop("baseline", "save", "twin-big", big.metrics_url, "--duration", DURATION,
              "--probe", "--no-gpu", env=env),
        kvtop("record", small.metrics_url, "-o", str(recording), "--duration", DURATION,
              env=env))


def test_a_smaller_pool_is_named_and_judged_worse(twins: tuple[TwinServer, TwinServer],
                                                  tmp_path: Path) -> None:
    big, small = twins
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    recording = tmp_path / "small.jsonl.gz"
    with SteadyLoad(big.base_url, 1) as big_load, SteadyLoad(small.base_url, 1) as small_load:
        saved, recorded = asyncio.run(watch_both(big, small, env, recording))
    assert saved[0] == 0, saved[2]
    assert recorded[0] == 0, recorded[2]
    assert not big_load.errors and not small_load.errors, (big_load.errors + small_load.errors)[:3]

    baseline = json.loads((tmp_path / "kvtop/baselines/twin-big.json").read_text())
    (target,) = baseline["targets"]
    assert target["server"] == {"kind": "vllm", "version": "0.33.0", "version_inferred": False}
    (engine,) = target["engines"]
    assert engine["config"]["num_gpu_blocks"] == BIG and engine["config"]["block_size"] == 16
    assert engine["config"]["prefix_caching"] is True
    probe = target["probe"]
    assert probe["prompt"] == "token_ids" and probe["model"] == "twin-llama"
    assert probe["requests"] == 5 and probe["failed"] == 0 and probe["prompt_tokens"] == 32
    assert len(probe["figures"]["ttft"]["per_request"]) == 5

    code, out, err = asyncio.run(kvtop("compare", "twin-big", "--replay", str(recording),
                                       "--json", env=env))
    assert code == 1, err
    doc: dict[str, Any] = json.loads(out)
    assert doc["config_changes"][0]["key"] == "num_gpu_blocks"
    assert (doc["config_changes"][0]["baseline"], doc["config_changes"][0]["now"]) == (BIG, SMALL)
    figures = {f["figure"]: f for f in doc["engines"][0]["figures"]}
    worse = {key for key, f in figures.items() if f["verdict"] == "worse"}
    assert "kv_usage" in worse and worse & {"waiting", "preemptions_per_min"}, figures
    assert doc["probes"][0]["note"].startswith("not probed")  # a recording can't be probed
    SUMMARY.append("baseline: KV p50 {:.2f} -> {:.2f}, waiting {:.1f} -> {:.1f}, worse: {}"
                   .format(figures["kv_usage"]["baseline"], figures["kv_usage"]["now"],
                           figures["waiting"]["baseline"], figures["waiting"]["now"],
                           ", ".join(sorted(worse))))
