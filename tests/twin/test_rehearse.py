"""`kvtop rehearse` against a real `vllm serve` (0.33.0, fake executor): a short rehearsal is
GO, and its per-request log agrees with vLLM's own counters.

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


@pytest.fixture(scope="module")
def twin(twin_setup: TwinSetup) -> Iterator[TwinServer]:
    server = TwinServer.launch("rehearse", SPEC, twin_setup.python, twin_setup.model_dir,
                               twin_setup.work)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


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
    kvtop = Path(sys.executable).parent / "kvtop"
    done = subprocess.run(
        [str(kvtop), "rehearse", twin.base_url, "--token-ids", "--duration", "45s",
         "--rate", "1", "--out", str(tmp_path / "out"), "--no-gpu", "--quiet", "--json"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout[-2000:]
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "go"
    assert doc["target"]["server"] == {"kind": "vllm", "version": "0.33.0"}
    assert doc["target"]["model"] == "twin-llama" and doc["target"]["max_model_len"] == 4096
    assert doc["criteria"]["kv_free"]["state"] == "ok"
    assert doc["requests"]["failed"] == doc["requests"]["cut"] == 0
    lines = [json.loads(line) for line in
             (tmp_path / "out/requests.jsonl").read_text(encoding="utf-8").splitlines()]
    vllm = vllm_counters(twin.base_url)
    assert len(lines) == vllm["requests"] == doc["requests"]["ok"] >= 40
    assert sum(line["prompt_tokens"] for line in lines) == vllm["vllm:prompt_tokens_total"]
    assert sum(line["completion_tokens"] for line in lines) == \
        vllm["vllm:generation_tokens_total"]
    # token ids of the planned length: what vLLM counted is what was planned
    assert all(line["prompt_tokens"] == line["planned_prompt_tokens"] for line in lines)
    assert all(line["completion_tokens"] == line["max_tokens"] for line in lines)
    SUMMARY.append(f"rehearse: {len(lines)} requests, TTFT p50 first/last third "
                   f"{doc['criteria']['latency']['figures']['ttft_s']}")
