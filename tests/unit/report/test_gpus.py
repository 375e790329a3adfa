"""A GPU as the snapshot JSON's ``gpus`` gives it (docs/snapshot-json.md): every documented
key with the reading's value, null where the source does not say; and exporters' MiB read
as bytes.

The snapshot's GPUs when no reader is handed in: it reads this machine's NVML."""

from __future__ import annotations

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.gpu import GpuProcess, GpuReading, Workload, gpu_to_json
from kvtop.derive.gpu_owners import local_host
from kvtop.report import gpus
from kvtop.report.gpus import gpu_report
from tests.fakes.fake_nvml import FakeGpuReader


def test_a_local_gpu_in_the_snapshot_has_every_documented_key() -> None:
    gpu = GpuReading(index=3, name="NVIDIA L40S", uuid="GPU-77", memory_used_bytes=5_000,
                     memory_total_bytes=48_000, util_percent=12.5, temperature_c=40.0,
                     power_w=88.5, processes=(GpuProcess(321, "python3 -m vllm", 4_000, True),
                                              GpuProcess(654, "pid 654", None, False)))
    [entry], _ = gpu_report([], reader=FakeGpuReader([gpu]))
    assert entry == {
        "index": 3, "name": "NVIDIA L40S", "uuid": "GPU-77",
        "memory_used_bytes": 5_000, "memory_total_bytes": 48_000,
        "utilization_percent": 12.5, "temperature_c": 40.0, "power_w": 88.5,
        "processes": [
            {"pid": 321, "name": "python3 -m vllm", "used_gpu_memory_bytes": 4_000,
             "is_vllm": True, "owner": None},
            {"pid": 654, "name": "pid 654", "used_gpu_memory_bytes": None, "is_vllm": False,
             "owner": None}],
        "source": "nvml", "host": local_host(), "target": None, "mig": None,
        "kubernetes": [], "owners": []}


def test_an_exporters_mig_instance_and_pods_are_kept_in_the_json() -> None:
    gpu = GpuReading(index=None, name="NVIDIA A100", uuid="GPU-a1", memory_used_bytes=None,
                     memory_total_bytes=None, util_percent=None, temperature_c=None,
                     power_w=None, source="dcgm", host="node-b", mig_instance="13",
                     mig_profile="1g.5gb",
                     workloads=(Workload("prod", "vllm-0", "vllm"), Workload(None, "job", None)))
    assert gpu_to_json(gpu) == {
        "index": None, "name": "NVIDIA A100", "uuid": "GPU-a1",
        "memory_used_bytes": None, "memory_total_bytes": None, "utilization_percent": None,
        "temperature_c": None, "power_w": None, "processes": [], "source": "dcgm",
        "host": "node-b", "mig": {"instance": "13", "profile": "1g.5gb"},
        "kubernetes": [{"namespace": "prod", "pod": "vllm-0", "container": "vllm"},
                       {"namespace": None, "pod": "job", "container": None}]}


def test_dcgm_memory_in_mib_is_bytes_in_the_json() -> None:
    body = ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-x",Hostname="n"} 1000\n'
            'DCGM_FI_DEV_FB_TOTAL{gpu="0",UUID="GPU-x",Hostname="n"} 40960\n')
    [gpu] = read_exposition(body).gpus
    entry = gpu_to_json(gpu)
    assert (entry["memory_used_bytes"], entry["memory_total_bytes"]) == (
        1000 * 1_048_576, 40960 * 1_048_576)


def test_without_a_reader_the_snapshot_reads_this_machines_nvml(
        monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeGpuReader()
    monkeypatch.setattr(gpus, "read_gpus", nvml.read)
    found, sources = gpus.gpu_report([])
    assert nvml.reads == 1 and len(found) == len(nvml.gpus) > 0
    assert [(s["source"], s["status"], s["gpus"]) for s in sources] == [
        ("nvml", "ok", len(nvml.gpus))]
