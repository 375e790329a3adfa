"""`kvtop snapshot` (a subprocess, as a user runs it) on GPU exporters served on 127.0.0.1
with real bodies, beside a vLLM server on the same host: no flag tells kvtop what they are,
every GPU says where it is and whose it is, and a source that failed says so."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kvtop.collect.gpu import MIB
from tests.faultserver import FaultServer, fixture
from tests.gpu_fixtures import DCGM_MIG, NVIDIA_SMI_H100, gpu_fixture
from tests.test_snapshot_cli import run_kvtop


def exporter(name: str) -> FaultServer:
    return FaultServer(bodies=[gpu_fixture(name).encode()], version=None)


def by_target(document: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for gpu in document["gpus"]:
        out.setdefault(gpu["target"], []).append(gpu)
    return out


async def test_exporters_are_recognised_and_their_gpus_owned() -> None:
    async with exporter(DCGM_MIG) as dcgm, exporter(NVIDIA_SMI_H100) as smi, \
            FaultServer() as vllm:
        urls = vllm_url, dcgm_url, smi_url = vllm.url(), dcgm.url(), smi.url()
        code, out, err, _ = await run_kvtop("snapshot", *urls, "--json", "--interval", "0.3")
    assert code == 0, err
    document = json.loads(out)
    kinds = {t["target"]: t["server"]["kind"] for t in document["targets"]}
    assert kinds == {vllm_url: "vllm", dcgm_url: "dcgm", smi_url: "nvidia_gpu_exporter"}
    gpus = by_target(document)
    whole, instance = gpus[dcgm_url]
    assert (whole["source"], whole["host"], whole["mig"]) == ("dcgm", "ub20-a100-k8s", None)
    assert instance["mig"] == {"instance": "13", "profile": "1g.5gb"}
    assert instance["memory_used_bytes"] is None  # not exported for the instance: null
    assert whole["memory_used_bytes"] == 4845 * MIB
    (h100,) = gpus[smi_url]
    assert (h100["name"], h100["host"], h100["source"]) == (
        "NVIDIA H100 80GB HBM3", "127.0.0.1", "nvidia_gpu_exporter")
    # the vLLM server runs on the exporters' host (127.0.0.1): it owns their GPUs
    owner = {"target": vllm_url, "label": vllm_url.split("//")[1].split("/")[0], "by": "host"}
    assert whole["owners"] == instance["owners"] == h100["owners"] == [owner]
    sources = {s["target"]: s for s in document["gpu_sources"]}
    assert sources[dcgm_url] == {"source": "dcgm", "target": dcgm_url,
                                   "host": "127.0.0.1", "status": "ok", "error": None,
                                   "gpus": 2}
    nvml = sources[None]
    assert nvml["source"] == "nvml"
    if nvml["status"] != "ok":  # this machine has no NVIDIA driver: the reason, not []
        assert nvml["error"] and nvml["gpus"] == 0


async def test_an_exporter_that_fails_says_so() -> None:
    async with exporter(NVIDIA_SMI_H100) as smi:
        run = asyncio.ensure_future(run_kvtop("snapshot", smi.url(), "--json", "--no-gpu",
                                              "--interval", "1"))
        while smi.hits < 1 and not run.done():
            await asyncio.sleep(0.02)
        smi.mode = "error500"  # the second read fails
        code, out, err, _ = await run
    assert code == 3, err
    document = json.loads(out)
    (source,) = document["gpu_sources"]  # --no-gpu: NVML not asked, not listed
    assert source["status"] == "failed" and "HTTP 500" in source["error"]
    assert source["gpus"] == 1  # the last values are still shown, marked stale
    assert document["targets"][0]["status"] == "stale"
    assert len(document["gpus"]) == 1


async def test_no_gpu_exporter_no_gpu_sources_but_nvml() -> None:
    async with FaultServer(bodies=[fixture()]) as vllm:
        code, out, err, _ = await run_kvtop("snapshot", vllm.url(), "--json", "--no-gpu",
                                            "--samples", "1")
    assert code == 0, err
    document = json.loads(out)
    assert document["gpus"] == [] and document["gpu_sources"] == []
