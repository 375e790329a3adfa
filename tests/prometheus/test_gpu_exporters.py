"""GPU exporters through a real Prometheus: dcgm-exporter and nvidia_gpu_exporter serving
real bodies (tests/fixtures/gpu) beside two simulated vLLM servers, one of them labelled
with its Kubernetes pod as service discovery would. kvtop finds the exporters with the
same batched query as the servers, reads the same GPUs as direct scraping, and gives each
GPU its owners: by pod where dcgm-exporter names one, by host otherwise."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvtop.collect.prometheus import PrometheusSource, load_settings
from kvtop.derive.tracker import TargetTracker
from tests.prometheus.conftest import PromEnv, _wait_ready, start_prometheus, stop
from tests.prometheus.test_prometheus import kvtop

POD = {"namespace": "foo", "pod": "bar"}  # the pod dcgm-datadog-pod-labels.txt names


@dataclass(frozen=True)
class GpuProm:
    url: str
    urls: dict[str, str]  # fleet member -> its /metrics URL

    def instance(self, name: str) -> str:
        return PromEnv.instance(self.urls[name])


def _config(urls: dict[str, str]) -> str:
    def job(name: str, members: list[str], labels: str = "", honor: bool = False) -> str:
        targets = ", ".join(f'"{PromEnv.instance(urls[m])}"' for m in members)
        extra = f"        labels: {labels}\n" if labels else ""
        return (f"  - job_name: {name}\n    honor_labels: {str(honor).lower()}\n"
                f"    static_configs:\n      - targets: [{targets}]\n{extra}")

    pod_labels = "{" + ", ".join(f"{k}: {v}" for k, v in POD.items()) + "}"
    return ("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
            + job("vllm", ["vllm"]) + job("vllm-pod", ["vllm_pod"], pod_labels)
            # dcgm-exporter's ServiceMonitor keeps the exporter's own pod labels
            + job("dcgm", ["dcgm", "dcgm_pod"], honor=True) + job("gpu", ["nvidia_smi"]))


@pytest.fixture(scope="module")
def gpu_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuProm]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus tier skipped: no 'prometheus' binary on PATH")
    tmp = tmp_path_factory.mktemp("gpu-prometheus")
    fleet = subprocess.Popen([sys.executable, "-m", "tests.prometheus.gpu_fleet"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    prometheus = None
    try:
        assert fleet.stdout is not None
        urls = json.loads(fleet.stdout.readline())
        (tmp / "prometheus.yml").write_text(_config(urls))
        prometheus, url = start_prometheus(binary, tmp)
        _wait_ready(url, [PromEnv.instance(u) for u in urls.values()], prometheus)
        yield GpuProm(url, urls)
    finally:
        stop(prometheus, fleet)


def _gpus_of(document: dict[str, Any], target_url: str) -> list[dict[str, Any]]:
    return [gpu for gpu in document["gpus"] if gpu["target"] == target_url]


async def test_exporters_through_prometheus_read_as_direct_scraping(gpu_prom: GpuProm,
                                                                    tmp_path: Path) -> None:
    code, through, err = await kvtop("snapshot", "--prometheus", gpu_prom.url, "--json",
                                     "--no-gpu")
    names = ("dcgm", "nvidia_smi")
    direct_code, direct, _ = await kvtop("snapshot", *(gpu_prom.urls[n] for n in names),
                                         "--json", "--no-gpu", "--samples", "1")
    assert (code, direct_code) == (0, 0), err
    kinds = {t["name"]: t["server"]["kind"] for t in through["targets"]}
    assert kinds[gpu_prom.instance("dcgm")] == "dcgm"
    assert kinds[gpu_prom.instance("nvidia_smi")] == "nvidia_gpu_exporter"
    by_target = {t["name"]: t["target"] for t in through["targets"]}
    for name in names:
        via = _gpus_of(through, by_target[gpu_prom.instance(name)])
        straight = _gpus_of(direct, gpu_prom.urls[name])
        assert via and len(via) == len(straight)
        for ours, theirs in zip(via, straight, strict=True):
            for key in ("uuid", "name", "index", "memory_used_bytes", "memory_total_bytes",
                        "utilization_percent", "temperature_c", "power_w", "source", "mig"):
                assert ours[key] == theirs[key], (name, key)
    t4 = _gpus_of(through, by_target[gpu_prom.instance("dcgm")])[0]
    assert t4["host"] == "424773df46e0"  # dcgm's Hostname label, kept through Prometheus
    assert t4["memory_total_bytes"] == 15109 * 2**20  # FB_USED + FB_FREE, in bytes
    sources = {s["target"]: s for s in through["gpu_sources"]}
    assert sources[by_target[gpu_prom.instance("dcgm")]]["status"] == "ok"


async def test_gpus_are_owned_by_pod_else_by_host(gpu_prom: GpuProm) -> None:
    code, document, err = await kvtop("snapshot", "--prometheus", gpu_prom.url, "--json",
                                      "--no-gpu")
    assert code == 0, err
    by_target = {t["name"]: t["target"] for t in document["targets"]}
    servers = {by_target[gpu_prom.instance(n)]: n for n in ("vllm", "vllm_pod")}

    def owners(name: str) -> dict[str, str]:
        (gpu, *_) = _gpus_of(document, by_target[gpu_prom.instance(name)])
        return {servers[o["target"]]: o["by"] for o in gpu["owners"]}

    # dcgm-exporter names pod foo/bar on this GPU; Prometheus put the same pod on one server
    assert owners("dcgm_pod") == {"vllm_pod": "pod"}
    # no pod on these: every server on the exporter's host (127.0.0.1) owns them
    assert owners("dcgm") == {"vllm": "host", "vllm_pod": "host"}
    assert owners("nvidia_smi") == {"vllm": "host", "vllm_pod": "host"}


async def test_exporters_cost_no_extra_query_per_refresh(gpu_prom: GpuProm) -> None:
    source = PrometheusSource(load_settings(gpu_prom.url), interval_s=1.0)
    async with source:
        targets = await source.discover()
        before = source.api.requests
        scrapes = await source.poll_once()
        asked = source.api.requests - before
    assert {gpu_prom.instance(n) for n in ("dcgm", "dcgm_pod", "nvidia_smi")} <= \
        {t.name for t in targets}
    assert asked == 2  # the fleet's samples and its `up`: GPU exporters ride along
    gpu_scrapes = [s for s in scrapes if s.target.name == gpu_prom.instance("nvidia_smi")]
    state = TargetTracker(gpu_scrapes[0].target).update(gpu_scrapes[-1])
    assert state.kind == "nvidia_gpu_exporter"
    assert [p.pid for p in state.gpus[0].processes] == [11327, 11328, 11345]
