"""The GPU exporters' real bodies (tests/fixtures/gpu) through kvtop's adapters: recognised
from the body, one row per GPU and per MIG instance, units right, and a value an exporter
does not give is None, never 0. Expected values are read off the files (lines quoted).

Beyond those bodies, what kvtop reads from the GPU exporters: the rows in a stable order
(host, GPU number, the whole GPU before its MIG instances), what each exporter says a value
is when it is missing, blank or impossible, processes and who of them is vLLM, and the note
when an exporter gives no GPU. Lines are written the way dcgm-exporter and
nvidia_gpu_exporter write them (the fixtures show both)."""

from __future__ import annotations

import pytest

from kvtop.collect.adapters import dcgm, names_for, read_exposition
from kvtop.collect.adapters import nvidia_gpu_exporter as smi
from kvtop.collect.gpu import MAX_GPUS_PER_EXPORTER, MIB, GpuReading, Workload, normal_uuid
from tests.scenarios.gpu import (
    DCGM_MIG,
    DCGM_POD,
    DCGM_T4,
    GPU_FIXTURES,
    NVIDIA_SMI_H100,
    gpu_fixture,
)
from tests.support.paths import fixture_text

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


INT32_BLANK = 0x7FFFFFF0  # DCGM_INT32_BLANK: DCGM's "no data" for 32-bit fields


def dcgm_line(field: str, value: float, *, gpu: str | None = "0", uuid: str | None = None,
         host: str | None = "node-a", instance: str | None = None, **extra: str) -> str:
    labels = {"gpu": gpu, "UUID": uuid if uuid is not None else f"GPU-{host}-{gpu}",
              "device": f"nvidia{gpu}", "modelName": "NVIDIA A100-SXM4-40GB",
              "Hostname": host, **extra}
    if instance is not None:
        labels |= {"GPU_I_PROFILE": "1g.5gb", "GPU_I_ID": instance}
    text = ",".join(f'{k}="{v}"' for k, v in labels.items() if v is not None)
    return f"DCGM_FI_{field}{{{text}}} {value}\n"


def dcgm_gpus(body: str, version: str | None = None) -> list[GpuReading]:
    reading = read_exposition(body, version=version)
    assert reading.kind == "dcgm", reading.kind
    return reading.gpus


def test_dcgm_rows_go_by_host_then_gpu_number_then_whole_gpu_before_its_instances() -> None:
    body = "".join([
        dcgm_line("DEV_GPU_TEMP", 50, host="node-b", gpu="0"),
        dcgm_line("DEV_GPU_TEMP", 51, host="node-a", gpu="1"),
        dcgm_line("PROF_GR_ENGINE_ACTIVE", 0.5, host="node-a", gpu="0", instance="13"),
        dcgm_line("PROF_GR_ENGINE_ACTIVE", 0.5, host="node-a", gpu="0", instance="1"),
        dcgm_line("DEV_GPU_TEMP", 52, host="node-a", gpu="0"),
        dcgm_line("PROF_GR_ENGINE_ACTIVE", 0.5, host="node-a", gpu="0", instance="0"),
        dcgm_line("DEV_FB_USED", 53, host="node-a", gpu="0"),
        dcgm_line("DEV_GPU_TEMP", 54, host="node-a", gpu="x", uuid="GPU-yy"),  # no GPU number
        dcgm_line("DEV_GPU_TEMP", 55, host=None, gpu="7"),  # no Hostname: the exporter's host
        dcgm_line("DEV_GPU_TEMP", 56, host="10.0.0.5", gpu="0"),
    ])
    rows = [(g.host, g.index, g.mig_instance) for g in dcgm_gpus(body)]
    assert rows == [(None, 7, None), ("10.0.0.5", 0, None), ("node-a", None, None),
                    ("node-a", 0, None), ("node-a", 0, "0"), ("node-a", 0, "1"),
                    ("node-a", 0, "13"), ("node-a", 1, None), ("node-b", 0, None)]


def test_dcgm_gpus_of_one_host_go_by_number_not_by_uuid() -> None:
    body = "".join(dcgm_line("DEV_GPU_TEMP", 40 + n, gpu=str(n), uuid=f"GPU-{9 - n}")
                   for n in (3, 1, 2, 0))
    assert [g.index for g in dcgm_gpus(body)] == [0, 1, 2, 3]


def test_dcgm_gpu_numbers_of_up_to_five_digits_are_numbers() -> None:
    body = dcgm_line("DEV_GPU_TEMP", 50, gpu="99999") + dcgm_line("DEV_GPU_TEMP", 50, gpu="123456")
    assert sorted(g.index for g in dcgm_gpus(body) if g.index is not None) == [99999]
    assert [g.index for g in dcgm_gpus(body)].count(None) == 1


def test_dcgm_without_uuid_tells_gpus_apart_by_number() -> None:
    # a relabelled or trimmed exporter: the gpu label is all there is
    body = "".join(dcgm_line("DEV_FB_USED", 100 * n, gpu=str(n), uuid="") for n in (0, 1))
    body = body.replace('UUID="",', "", 1)  # one without the label, one with it empty
    first, second = dcgm_gpus(body)
    assert (first.uuid, first.index, first.memory_used_bytes) == ("", 0, 0)
    assert (second.uuid, second.index, second.memory_used_bytes) == ("", 1, 100 * MIB)
    assert (first.key[0], second.key[0]) == ("#0", "#1")


def test_dcgm_a_sample_naming_no_gpu_is_passed_over_not_the_end() -> None:
    body = ('DCGM_FI_DEV_GPU_TEMP{Hostname="node-a"} 20\n'
            + dcgm_line("DEV_GPU_TEMP", 50, gpu="0") + dcgm_line("DEV_GPU_TEMP", 51, gpu="1"))
    assert [(g.index, g.temperature_c) for g in dcgm_gpus(body)] == [(0, 50.0), (1, 51.0)]


def test_dcgm_total_memory_is_used_free_and_reserved_without_fb_total() -> None:
    body = (dcgm_line("DEV_FB_USED", 1000) + dcgm_line("DEV_FB_FREE", 39000)
            + dcgm_line("DEV_FB_RESERVED", 536))
    (gpu,) = dcgm_gpus(body)
    assert gpu.memory_total_bytes == (1000 + 39000 + 536) * MIB


def test_dcgm_fb_total_wins_and_free_alone_gives_no_total() -> None:
    body = (dcgm_line("DEV_FB_TOTAL", 40960) + dcgm_line("DEV_FB_USED", 1000)
            + dcgm_line("DEV_FB_FREE", 30000))
    (gpu,) = dcgm_gpus(body)
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (1000 * MIB, 40960 * MIB)
    (gpu,) = dcgm_gpus(dcgm_line("DEV_FB_FREE", 30000))
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (None, None)


def test_dcgm_int32_blank_is_no_value() -> None:
    (gpu,) = dcgm_gpus(dcgm_line("DEV_GPU_TEMP", INT32_BLANK) + dcgm_line("DEV_POWER_USAGE", 300))
    assert (gpu.temperature_c, gpu.power_w) == (None, 300.0)
    (gpu,) = dcgm_gpus(dcgm_line("DEV_GPU_TEMP", INT32_BLANK - 1))
    assert gpu.temperature_c == INT32_BLANK - 1


@pytest.mark.parametrize("name, value, percent", [
    ("DEV_GPU_UTIL", 100, 100.0), ("DEV_GPU_UTIL", 100.5, None), ("DEV_GPU_UTIL", 150, None),
    ("PROF_GR_ENGINE_ACTIVE", 1.0, 100.0), ("PROF_GR_ENGINE_ACTIVE", 1.5, None),
])
def test_dcgm_use_over_100_percent_is_unknown(name: str, value: float,
                                              percent: float | None) -> None:
    (gpu,) = dcgm_gpus(dcgm_line(name, value))
    assert gpu.util_percent == percent


def test_dcgm_a_gpu_without_model_name_is_called_gpu() -> None:
    line = dcgm_line("DEV_GPU_TEMP", 50).replace('modelName="NVIDIA A100-SXM4-40GB",', "")
    (gpu,) = dcgm_gpus(line)
    assert gpu.name == "GPU" and gpu.source == "dcgm"


def test_dcgm_with_gpus_has_no_note_and_keeps_the_version() -> None:
    reading = read_exposition(dcgm_line("DEV_GPU_TEMP", 50), version="3.3.5-3.4.0")
    assert (reading.notes, reading.version) == ([], "3.3.5-3.4.0")


def test_dcgm_without_a_gpu_says_so() -> None:
    reading = read_exposition('DCGM_FI_DEV_GPU_TEMP{Hostname="node-a"} 20\n')
    assert reading.kind == "dcgm" and reading.gpus == []
    assert reading.notes == ["dcgm-exporter: no GPU's memory, use, temperature or power"]


def smi_line(metric: str, value: float, uuid: str | None = "u0", **labels: str) -> str:
    pairs = {**labels, "uuid": uuid}
    text = ",".join(f'{k}="{v}"' for k, v in pairs.items() if v is not None)
    return f"nvidia_smi_{metric}{{{text}}} {value}\n"


def smi_info(uuid: str, index: str | None, name: str = "NVIDIA H100 80GB HBM3") -> str:
    labels = {"index": index} if index is not None else {}
    return smi_line("gpu_info", 1, uuid=uuid, name=name, **labels)


def smi_gpus(body: str) -> list[GpuReading]:
    reading = read_exposition(body)
    assert reading.kind == "nvidia_gpu_exporter", reading.kind
    return reading.gpus


def test_smi_gpus_go_by_number_then_uuid_a_gpu_without_one_first() -> None:
    body = "".join([
        smi_info("a2", "2") + smi_line("temperature_gpu", 40, uuid="a2"),
        smi_info("z0", "0") + smi_line("temperature_gpu", 41, uuid="z0"),
        smi_info("b1", "1") + smi_line("temperature_gpu", 42, uuid="b1"),
        smi_info("c1", "1") + smi_line("temperature_gpu", 43, uuid="c1"),
        smi_info("y", None) + smi_line("temperature_gpu", 44, uuid="y"),
    ])
    assert [(g.index, g.uuid) for g in smi_gpus(body)] == [
        (None, "y"), (0, "z0"), (1, "b1"), (1, "c1"), (2, "a2")]


def test_smi_the_index_comes_from_gpu_info_else_from_nvidia_smi_index() -> None:
    body = smi_info("u0", "3") + smi_line("temperature_gpu", 40)
    assert [g.index for g in smi_gpus(body)] == [3]
    body = smi_info("u0", None) + smi_line("index", 5) + smi_line("temperature_gpu", 40)
    assert [g.index for g in smi_gpus(body)] == [5]
    body = smi_info("u0", None) + smi_line("temperature_gpu", 40)
    assert [g.index for g in smi_gpus(body)] == [None]


def test_smi_an_index_of_100000_or_more_is_no_gpu_number() -> None:
    body = smi_line("index", 99_999) + smi_line("index", 100_000, uuid="u1")
    assert sorted((g.uuid, g.index) for g in smi_gpus(body)) == [("u0", 99_999), ("u1", None)]


def test_smi_gpu_info_wins_over_the_name_label_of_older_releases() -> None:
    body = smi_info("u0", "3") + smi_line("memory_used_bytes", 1e9, name="Tesla V100")
    (gpu,) = smi_gpus(body)
    assert (gpu.name, gpu.index) == ("NVIDIA H100 80GB HBM3", 3)


def test_smi_series_without_uuid_name_no_gpu() -> None:
    body = (smi_line("gpu_info", 1, uuid=None, name="ghost", index="9")
            + smi_line("temperature_gpu", 40, uuid=None) + smi_info("u0", "0")
            + smi_line("temperature_gpu", 41))
    assert [(g.uuid, g.name, g.temperature_c) for g in smi_gpus(body)] == [
        ("u0", "NVIDIA H100 80GB HBM3", 41.0)]


def test_smi_a_gpu_with_nothing_but_values_is_a_nameless_gpu() -> None:
    (gpu,) = smi_gpus(smi_line("temperature_gpu", 40))
    assert (gpu.name, gpu.index, gpu.uuid, gpu.source) == ("GPU", None, "u0",
                                                            "nvidia_gpu_exporter")
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes, gpu.util_percent) == (None,) * 3
    assert gpu.processes == ()


@pytest.mark.parametrize("ratio, percent", [(0.25, 25.0), (1.0, 100.0), (1.5, None)])
def test_smi_use_is_a_ratio_and_over_one_is_unknown(ratio: float, percent: float | None) -> None:
    (gpu,) = smi_gpus(smi_line("utilization_gpu_ratio", ratio))
    assert gpu.util_percent == percent


def test_smi_negative_or_nan_values_are_unknown() -> None:
    body = (smi_line("temperature_gpu", -1) + smi_line("power_draw_watts", float("nan"))
            + smi_line("memory_used_bytes", 2e9) + smi_line("memory_total_bytes", 8e10))
    (gpu,) = smi_gpus(body)
    assert (gpu.temperature_c, gpu.power_w) == (None, None)
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (2_000_000_000, 80_000_000_000)


def app(pid: str, name: str, used: float | None = None, uuid: str = "u0") -> str:
    labels = {"pid": pid, "process_name": name}
    line = smi_line("compute_app_info", 1, uuid=uuid, **labels)
    return line if used is None else line + smi_line("compute_app_used_memory_bytes", used,
                                                 uuid=uuid, **labels)


def test_smi_processes_their_memory_and_which_is_vllm() -> None:
    body = (smi_line("temperature_gpu", 40) + app("4101", "VLLM::EngineCore", 7e10)
            + app("4102", "python3 -m vllm.entrypoints.openai.api_server")  # memory not said
            + app("4103", "./gpu_burn", 1e9) + app("999999999", "big-pid", 1.0)
            + app("1234567890", "not-a-pid", 1.0))
    (gpu,) = smi_gpus(body)
    assert [(p.pid, p.name, p.used_bytes, p.is_vllm) for p in gpu.processes] == [
        (4101, "VLLM::EngineCore", 70_000_000_000, True),
        (4102, "python3 -m vllm.entrypoints.openai.api_server", None, True),
        (4103, "./gpu_burn", 1_000_000_000, False),
        (999999999, "big-pid", 1, False)]


def test_smi_at_most_256_processes_a_gpu() -> None:
    body = smi_line("temperature_gpu", 40) + "".join(app(str(1000 + i), "worker", 1e6)
                                                 for i in range(300))
    (gpu,) = smi_gpus(body)
    assert [p.pid for p in gpu.processes] == list(range(1000, 1256))


def test_smi_with_gpus_has_no_note_and_keeps_the_version() -> None:
    reading = read_exposition(gpu_fixture(NVIDIA_SMI_H100), version="1.4.1")
    assert (reading.notes, reading.version) == ([], "1.4.1")
    assert [g.source for g in reading.gpus] == ["nvidia_gpu_exporter"]


def test_smi_without_a_gpu_says_so() -> None:
    reading = read_exposition(smi_line("gpu_info", 1, uuid=None, name="ghost"))
    assert reading.kind == "nvidia_gpu_exporter" and reading.gpus == []
    assert reading.notes == ["nvidia_gpu_exporter: no GPU's memory, use, temperature or power"]


MANY_GPUS = {
    "nvidia_gpu_exporter": 'nvidia_smi_memory_used_bytes{{uuid="{i:08x}"}} 1024\n',
    "dcgm": 'DCGM_FI_DEV_FB_USED{{gpu="{i}",UUID="GPU-{i:08x}"}} 1\n',
}


@pytest.mark.parametrize("kind", sorted(MANY_GPUS))
def test_an_exporter_naming_too_many_gpus_keeps_the_first_and_says_so(kind: str) -> None:
    """An exporter naming 1,000 new GPUs every scrape had no cap."""
    def body(count: int) -> str:
        return "".join(MANY_GPUS[kind].format(i=i) for i in range(count))

    reading = read_exposition(body(1000))
    assert reading.kind == kind and len(reading.gpus) == MAX_GPUS_PER_EXPORTER
    assert f"{kind}: 1,000 GPUs; the first 256 are shown (more is not one node's)" in [
        note.replace("dcgm-exporter", "dcgm") for note in reading.notes]
    for count in (MAX_GPUS_PER_EXPORTER, MAX_GPUS_PER_EXPORTER + 1):
        notes = read_exposition(body(count)).notes
        assert any("GPUs; the first" in n for n in notes) is (count > MAX_GPUS_PER_EXPORTER)
