"""The GPU exporters' real bodies (tests/fixtures/gpu) through kvtop's adapters: recognised
from the body, one row per GPU and per MIG instance, units right, and a value an exporter
does not give is None, never 0. Expected values are read off the files (lines quoted)."""

from __future__ import annotations

import pytest

from kvtop.collect.adapters import dcgm, names_for, read_exposition
from kvtop.collect.adapters import nvidia_gpu_exporter as smi
from kvtop.collect.gpu import MIB, Workload, normal_uuid
from tests.gpu_fixtures import (
    DCGM_MIG,
    DCGM_POD,
    DCGM_T4,
    GPU_FIXTURES,
    NVIDIA_SMI_H100,
    gpu_fixture,
)
from tests.paths import fixture_text

T4_UUID = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"


def test_every_gpu_fixture_is_read_here() -> None:
    names = {p.name for p in GPU_FIXTURES.iterdir()} - {"INDEX.md"}
    assert names == {DCGM_T4, DCGM_POD, DCGM_MIG, NVIDIA_SMI_H100}


def test_dcgm_t4_one_row_per_gpu_and_missing_is_none() -> None:
    reading = read_exposition(gpu_fixture(DCGM_T4))
    assert reading.kind == "dcgm" and reading.engines == [] and reading.parse_errors == 0
    first, second = reading.gpus  # label-less dummies and the A10G's DRAM_ACTIVE name none
    assert (first.uuid, first.name, first.index, first.host) == (
        T4_UUID, "Tesla T4", 0, "424773df46e0")
    # FB_USED 0, FB_FREE 15109, no FB_TOTAL in dcgm-exporter 2.x: used + free, in bytes
    assert first.memory_used_bytes == 0
    assert first.memory_total_bytes == 15109 * MIB
    # GPU_UTIL 0, GPU_TEMP 25, POWER_USAGE 8.969000
    assert (first.util_percent, first.temperature_c, first.power_w) == (0.0, 25.0, 8.969)
    assert first.source == "dcgm" and first.mig_instance is None and first.workloads == ()
    # the second T4 exports FB_TOTAL 15109 but no FB_USED: its use is unknown, not 0
    assert second.host == "551bdf382151" and second.memory_total_bytes == 15109 * MIB
    assert second.memory_used_bytes is None
    assert (second.util_percent, second.temperature_c, second.power_w) == (None, None, None)


def test_dcgm_mig_instance_is_its_own_row() -> None:
    whole, instance = read_exposition(gpu_fixture(DCGM_MIG)).gpus
    assert whole.mig_instance is None and whole.uuid == instance.uuid
    # FB_USED 4845, FB_FREE 35690 (MiB); no GPU_UTIL: GR_ENGINE_ACTIVE 0.995630 stands in
    assert whole.memory_used_bytes == 4845 * MIB
    assert whole.memory_total_bytes == (4845 + 35690) * MIB
    assert whole.util_percent == pytest.approx(99.563)
    assert (whole.temperature_c, whole.power_w) == (61.0, 409.692)
    # GPU_I_PROFILE="1g.5gb",GPU_I_ID="13": only profiling fields for the instance
    assert (instance.mig_instance, instance.mig_profile) == ("13", "1g.5gb")
    assert instance.util_percent == pytest.approx(99.5687)
    assert instance.memory_used_bytes is None and instance.memory_total_bytes is None
    assert instance.host == "ub20-a100-k8s"


def test_dcgm_blank_sentinel_is_no_value() -> None:
    # NVIDIA's README shows DCGM_FI_DEV_MEMORY_TEMP ... 9223372036854775794: DCGM's "blank"
    body = gpu_fixture(DCGM_T4).replace(
        'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 25\n',
        'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 9223372036854775794\n')
    assert body != gpu_fixture(DCGM_T4)
    first = read_exposition(body).gpus[0]
    assert first.temperature_c is None and first.power_w == 8.969


def test_dcgm_pod_labels_name_the_workload() -> None:
    (gpu,) = read_exposition(gpu_fixture(DCGM_POD)).gpus
    assert gpu.workloads == (Workload("foo", "bar", "baz"),)
    assert gpu.util_percent == 0.0 and gpu.memory_used_bytes is None
    # Prometheus renames a label that clashes with its own target labels: exported_pod
    renamed = gpu_fixture(DCGM_POD).replace('namespace="foo",pod="bar"',
                                            'exported_namespace="foo",exported_pod="bar",'
                                            'namespace="monitoring",pod="dcgm-exporter-x"')
    (gpu,) = read_exposition(renamed).gpus
    assert gpu.workloads == (Workload("foo", "bar", "baz"),)


def test_nvidia_gpu_exporter_h100() -> None:
    reading = read_exposition(gpu_fixture(NVIDIA_SMI_H100))
    assert reading.kind == "nvidia_gpu_exporter" and reading.parse_errors == 0
    (gpu,) = reading.gpus
    # nvidia_smi_gpu_info{...,index="0",name="NVIDIA H100 80GB HBM3",...,uuid="0000…"} 1
    assert (gpu.name, gpu.index, gpu.uuid) == ("NVIDIA H100 80GB HBM3", 0,
                                               "00000000-0000-0000-0000-000000000000")
    # memory_used_bytes 2.0780679168e+10, memory_total_bytes 8.5520809984e+10: bytes already
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (20780679168, 85520809984)
    # utilization_gpu_ratio 1 (a ratio: 100 %), temperature_gpu 59, power_draw_watts 631.95
    assert (gpu.util_percent, gpu.temperature_c, gpu.power_w) == (100.0, 59.0, 631.95)
    assert gpu.host is None  # the exporter has no host label: the target's host is used
    # compute_app_used_memory_bytes{pid="11345",process_name="./gpu_burn",...} 1.645215744e+10
    assert [(p.pid, p.name, p.used_bytes) for p in gpu.processes] == [
        (11327, "/root/tools/memhog", 2690646016), (11328, "/root/tools/memhog", 1616904192),
        (11345, "./gpu_burn", 16452157440)]


def test_nvidia_gpu_exporter_before_gpu_info() -> None:
    # before 1.3 every series carried the name label and there was no gpu_info
    body = "\n".join(line for line in gpu_fixture(NVIDIA_SMI_H100).splitlines()
                     if "nvidia_smi_gpu_info" not in line)
    body = body.replace('{uuid="', '{name="NVIDIA H100 80GB HBM3",uuid="')
    (gpu,) = read_exposition(body).gpus
    assert (gpu.name, gpu.index) == ("NVIDIA H100 80GB HBM3", 0)  # nvidia_smi_index 0


def test_one_gpu_one_identity_across_exporters() -> None:
    # nvidia_gpu_exporter lower-cases the UUID and drops "GPU-"; NVML and dcgm keep them
    assert normal_uuid(T4_UUID) == normal_uuid(T4_UUID.lower()[4:]) == T4_UUID[4:].lower()


def test_narrowed_reads_ask_an_exporter_for_its_own_names() -> None:
    assert names_for(gpu_fixture(DCGM_T4)) == dcgm.NAMES
    assert names_for(gpu_fixture(NVIDIA_SMI_H100)) == smi.NAMES
    assert names_for(fixture_text("vllm-0.33.0-v1-twin-under-load.txt")) != dcgm.NAMES


def test_hostile_labels_are_kept_exact_and_bounded() -> None:
    # an index that is not a number is unknown; a name is kept as sent (views sanitise it)
    body = gpu_fixture(DCGM_MIG).replace('gpu="0"', 'gpu="\x1b[2J"').replace(
        'Hostname="ub20-a100-k8s"', 'Hostname="evil\x1b]52;c;aGk=\x07"')
    whole = read_exposition(body).gpus[0]
    assert whole.index is None and whole.host == "evil\x1b]52;c;aGk=\x07"
    huge = gpu_fixture(NVIDIA_SMI_H100).replace('pid="11327"', 'pid="99999999999999999999"')
    (gpu,) = read_exposition(huge).gpus
    assert [p.pid for p in gpu.processes] == [11328, 11345]  # not a pid: left out
