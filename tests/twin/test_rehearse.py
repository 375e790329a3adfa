"""`kvtop rehearse` against a real `vllm serve` (0.33.0, fake executor): a short rehearsal is
GO, and its per-request log agrees with vLLM's own counters; the same against a twin that
leaks 3 % of its requests' blocks is NO-GO naming the leak.

The twin has no tokenizer (`--skip-tokenizer-init`), so the driver sends token ids
(`--token-ids`; vLLM 0.33's /v1/completions takes a prompt as a list of ids and streams
usage per chunk with `continuous_usage_stats`). This test starts its own twin, so vLLM's
counters hold exactly the rehearsal's requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.twin.client import SUMMARY
from twin.serve import TwinServer, TwinSpec

if TYPE_CHECKING:
    from tests.twin.conftest import TwinSetup

SPEC = TwinSpec(num_blocks=800, step_delay_s=0.005)
LEAKING = TwinSpec(num_blocks=800, step_delay_s=0.005, leak_frac=0.03)


def launched(name: str, spec: TwinSpec, setup: TwinSetup) -> Iterator[TwinServer]:
    server = TwinServer.launch(name, spec, setup.python, setup.model_dir, setup.work)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def twin(twin_setup: TwinSetup) -> Iterator[TwinServer]:
    yield from launched("rehearse", SPEC, twin_setup)


@pytest.fixture(scope="module")
def leaking_twin(twin_setup: TwinSetup) -> Iterator[TwinServer]:
    yield from launched("rehearse-leak", LEAKING, twin_setup)


def rehearse(twin: TwinServer, out: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    """60 s at 2 requests/s: 40 answers a third, enough to judge latency, so a GO rests on
    free KV and latency both."""
    kvtop = Path(sys.executable).parent / "kvtop"
    done = subprocess.run(
        [str(kvtop), "rehearse", twin.base_url, "--token-ids", "--duration", "60s",
         "--rate", "2", "--out", str(out), "--no-gpu", "--quiet", "--json"],
        capture_output=True, text=True, timeout=600)
    return done, json.loads(done.stdout) if done.stdout.strip() else {}


def vllm_counters(base_url: str) -> dict[str, float]:
    """vLLM's own request and token counters, read with prometheus_client."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as answer:
        text = answer.read().decode("utf-8")
    out = {"requests": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total":
                out["requests"] += sample.value
            elif sample.name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
                out[sample.name] = sample.value
    return out


def test_a_short_rehearsal_is_go_and_agrees_with_vllm(twin: TwinServer, tmp_path: Path) -> None:
    done, doc = rehearse(twin, tmp_path / "out")
    assert done.returncode == 0, done.stderr + done.stdout[-2000:]
    assert doc["verdict"] == "go"
    assert [line.split(":")[0] for line in doc["evidence"]] == [
        "free KV not falling", "slow-request share not rising"]
    assert doc["target"]["server"] == {"kind": "vllm", "version": "0.33.0",
                                       "version_inferred": False}
    assert doc["target"]["model"] == "twin-llama" and doc["target"]["max_model_len"] == 4096
    assert doc["criteria"]["kv_free"]["state"] == "ok"
    assert doc["requests"]["failed"] == doc["requests"]["cut"] == 0
    lines = [json.loads(line) for line in
             (tmp_path / "out/requests.jsonl").read_text(encoding="utf-8").splitlines()]
    vllm = vllm_counters(twin.base_url)
    assert len(lines) == vllm["requests"] == doc["requests"]["ok"] >= 90
    assert sum(line["prompt_tokens"] for line in lines) == vllm["vllm:prompt_tokens_total"]
    assert sum(line["completion_tokens"] for line in lines) == \
        vllm["vllm:generation_tokens_total"]
    # token ids of the planned length: what vLLM counted is what was planned
    assert all(line["prompt_tokens"] == line["planned_prompt_tokens"] for line in lines)
    assert all(line["completion_tokens"] == line["max_tokens"] for line in lines)
    SUMMARY.append(f"rehearse: {len(lines)} requests, TTFT p50 first/last third "
                   f"{doc['criteria']['latency']['figures']['ttft_s']}")


def test_a_leaking_server_is_no_go_naming_the_leak(leaking_twin: TwinServer,
                                                   tmp_path: Path) -> None:
    """3 % of finished requests keep their blocks: they stay held at idle after the load
    (the twin's pool of 800 never fills in a minute), which alone is NO-GO."""
    done, doc = rehearse(leaking_twin, tmp_path / "out")
    assert done.returncode == 1, done.stderr + done.stdout[-2000:]
    assert doc["verdict"] == "no-go" and "kv_free" in doc["failed"]
    assert doc["reasons"][0].startswith("a leak: free KV not falling: failed")
    (engine,) = doc["criteria"]["kv_free"]["figures"]["engines"]
    assert engine["leak_size"]["blocks"] > engine["residual_threshold_blocks"]
    assert engine["leak_size"]["tokens"] == engine["leak_size"]["blocks"] * 16
    assert [a["lever"] for a in doc["advice"]] == ["leak"]
    SUMMARY.append(f"rehearse, leaking twin: {engine['leak_size']} held after the load, "
                   f"stopped: {doc['run']['stopped']}")
