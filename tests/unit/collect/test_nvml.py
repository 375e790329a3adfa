"""The NVML module against a fake pynvml: fields, caching, unsupported fields, no NVML.

Local GPUs as NVML reports them, against a fake pynvml (no GPU here) and the real one
(installed, with no driver): every field in kvtop's units, what a device cannot say left
out, the processes on each GPU named from /proc, and a reason (never a crash) without NVML."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvtop.collect import nvml as nvml_module
from kvtop.collect.nvml import NvmlReader, NvmlUnavailable, gpu_to_json, read_gpus
from tests.fakes.fake_nvml import GIB, FakeDevice, FakeNotSupported, FakeNVMLError, FakePynvml


def _proc_cmdline(tmp_path: Path, pid: int, argv: list[str]) -> None:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_reads_devices_and_marks_vllm_processes(tmp_path: Path) -> None:
    _proc_cmdline(tmp_path, 10, ["python3", "-m", "vllm.entrypoints.openai.api_server"])
    _proc_cmdline(tmp_path, 11, ["python3", "train.py"])
    device = FakeDevice(compute=[(10, 60 * GIB), (11, None), (12, GIB)])
    reader = NvmlReader(FakePynvml([device]), proc_root=tmp_path)
    [gpu] = reader.read()
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (70 * GIB, 80 * GIB)
    assert (gpu.util_percent, gpu.temperature_c, gpu.power_w) == (93.0, 61.0, 412.0)
    vllm, train, gone = gpu.processes
    assert vllm.is_vllm and vllm.name == "python3 -m vllm.entrypoints.openai.api_server"
    assert not train.is_vllm and train.used_bytes is None
    assert gone.name == "pid 12"  # its /proc entry is not visible here
    assert gpu_to_json(gpu)["processes"][0]["used_gpu_memory_bytes"] == 60 * GIB


def test_init_once_and_unsupported_fields_not_asked_again(tmp_path: Path) -> None:
    nvml = FakePynvml([FakeDevice(power_mw=None)])
    reader = NvmlReader(nvml, proc_root=tmp_path)
    first, second = reader.read(), reader.read()
    assert first[0].power_w is None and second[0].power_w is None
    assert nvml.calls == {"init": 1, "handle": 1, "power": 1}


def test_no_driver_is_a_reason_not_a_crash() -> None:
    reader = NvmlReader(FakePynvml([], init_error="Driver Not Loaded"))
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        reader.read()


def test_no_gpu_is_unavailable() -> None:
    with pytest.raises(NvmlUnavailable, match="no NVIDIA GPU"):
        NvmlReader(FakePynvml([])).read()


class FlakyPynvml(FakePynvml):
    """A fake whose devices fail chosen queries: ``failing[(uuid, query)]`` is the error
    class raised; every query asked is counted by (uuid, query)."""

    def __init__(self, devices: list[FakeDevice], failing: dict[tuple[str, str], type],
                 graphics: dict[str, list[Any]] | None = None) -> None:
        super().__init__(devices)
        self.failing = failing
        self.graphics = graphics or {}
        self.asked: dict[tuple[str, str], int] = {}

    def _ask(self, device: FakeDevice, query: str) -> None:
        self.asked[(device.uuid, query)] = self.asked.get((device.uuid, query), 0) + 1
        error = self.failing.get((device.uuid, query))
        if error is not None:
            raise error(query)

    def nvmlDeviceGetName(self, d: FakeDevice) -> Any:
        self._ask(d, "name")
        return super().nvmlDeviceGetName(d)

    def nvmlDeviceGetUUID(self, d: FakeDevice) -> Any:
        self._ask(d, "uuid")
        return super().nvmlDeviceGetUUID(d)

    def nvmlDeviceGetMemoryInfo(self, d: FakeDevice) -> Any:
        self._ask(d, "memory")
        return super().nvmlDeviceGetMemoryInfo(d)

    def nvmlDeviceGetUtilizationRates(self, d: FakeDevice) -> Any:
        self._ask(d, "util")
        return super().nvmlDeviceGetUtilizationRates(d)

    def nvmlDeviceGetTemperature(self, d: FakeDevice, sensor: int) -> int:
        self._ask(d, "temp")
        return super().nvmlDeviceGetTemperature(d, sensor)

    def nvmlDeviceGetPowerUsage(self, d: FakeDevice) -> int:
        self._ask(d, "power")
        return super().nvmlDeviceGetPowerUsage(d)

    def nvmlDeviceGetComputeRunningProcesses(self, d: FakeDevice) -> list[Any]:
        self._ask(d, "compute")
        return super().nvmlDeviceGetComputeRunningProcesses(d)

    def nvmlDeviceGetGraphicsRunningProcesses(self, d: FakeDevice) -> list[Any]:
        self._ask(d, "graphics")
        return self.graphics.get(d.uuid, [])


def _proc(root: Path, pid: int, cmdline: bytes) -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "cmdline").write_bytes(cmdline)


def test_every_field_in_kvtops_units_and_each_gpu_numbered_in_nvml_order(tmp_path: Path) -> None:
    first = FakeDevice(name="NVIDIA A100", uuid="GPU-1", used=3 * GIB, total=40 * GIB, util=7,
                       temp=44, power_mw=61_500)
    second = FakeDevice(name="NVIDIA L4", uuid="GPU-2", used=GIB, total=24 * GIB, util=100,
                        temp=80, power_mw=72_250)
    gpus = NvmlReader(FakePynvml([first, second]), proc_root=tmp_path).read()
    assert [(g.index, g.name, g.uuid, g.source) for g in gpus] == [
        (0, "NVIDIA A100", "GPU-1", "nvml"), (1, "NVIDIA L4", "GPU-2", "nvml")]
    assert [(g.memory_used_bytes, g.memory_total_bytes) for g in gpus] == [
        (3 * GIB, 40 * GIB), (GIB, 24 * GIB)]
    assert [(g.util_percent, g.temperature_c, g.power_w) for g in gpus] == [
        (7.0, 44.0, 61.5), (100.0, 80.0, 72.25)]
    assert all(isinstance(g.util_percent, float) and isinstance(g.temperature_c, float)
               for g in gpus)


def test_names_and_uuids_of_old_pynvml_as_bytes_are_text(tmp_path: Path) -> None:
    device = FakeDevice(name=b"Tesla T4 \xff", uuid=b"GPU-t4")  # type: ignore[arg-type]
    [gpu] = NvmlReader(FakePynvml([device]), proc_root=tmp_path).read()
    assert (gpu.name, gpu.uuid) == ("Tesla T4 \ufffd", "GPU-t4")


def test_a_field_a_device_cannot_give_is_none_and_the_rest_is_read(tmp_path: Path) -> None:
    device = FakeDevice(uuid="GPU-x")
    nvml = FlakyPynvml([device], {("GPU-x", q): FakeNotSupported
                                  for q in ("name", "uuid", "memory", "util", "temp")})
    [gpu] = NvmlReader(nvml, proc_root=tmp_path).read()
    assert (gpu.name, gpu.uuid) == ("GPU", "")
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes, gpu.util_percent,
            gpu.temperature_c) == (None, None, None, None)
    assert gpu.power_w == 412.0


def test_a_field_one_gpu_cannot_give_is_not_asked_of_it_again_but_still_of_the_others(
        tmp_path: Path) -> None:
    unsupported = ("name", "uuid", "memory", "util", "temp", "power", "compute")
    devices = [FakeDevice(uuid="GPU-a"), FakeDevice(name="L4", uuid="GPU-b", compute=[(7, GIB)])]
    nvml = FlakyPynvml(devices, {("GPU-a", query): FakeNotSupported for query in unsupported})
    reader = NvmlReader(nvml, proc_root=tmp_path)
    for _ in range(3):
        a, b = reader.read()
        assert (a.name, a.uuid, a.memory_used_bytes, a.util_percent, a.temperature_c,
                a.power_w, a.processes) == ("GPU", "", None, None, None, None, ())
        assert (b.name, b.uuid, b.memory_used_bytes, b.util_percent, b.temperature_c,
                b.power_w, [p.pid for p in b.processes]) == (
            "L4", "GPU-b", 70 * GIB, 93.0, 61.0, 412.0, [7])
    assert {query: nvml.asked[("GPU-a", query)] for query in unsupported} == dict.fromkeys(
        unsupported, 1)
    assert {query: nvml.asked[("GPU-b", query)] for query in unsupported} == dict.fromkeys(
        unsupported, 3)
    assert nvml.asked[("GPU-a", "graphics")] == 3  # another field of the same GPU


def test_a_passing_nvml_error_is_none_this_time_and_asked_again(tmp_path: Path) -> None:
    device = FakeDevice(uuid="GPU-a")
    nvml = FlakyPynvml([device], {("GPU-a", "memory"): FakeNVMLError})
    reader = NvmlReader(nvml, proc_root=tmp_path)
    assert reader.read()[0].memory_used_bytes is None
    del nvml.failing[("GPU-a", "memory")]
    assert reader.read()[0].memory_used_bytes == 70 * GIB
    assert nvml.asked[("GPU-a", "memory")] == 2


def test_compute_and_graphics_processes_are_listed_once_each_by_pid(tmp_path: Path) -> None:
    _proc(tmp_path, 30, b"python3\0-m\0VLLM.entrypoints.openai.api_server\0")
    _proc(tmp_path, 20, b"Xorg\0\0:0\0")
    device = FakeDevice(uuid="GPU-a", compute=[(30, 5 * GIB), (20, GIB)])
    graphics = [SimpleNamespace(pid=20, usedGpuMemory=2 * GIB), SimpleNamespace(pid=10),
                SimpleNamespace(pid=40, usedGpuMemory=None)]
    nvml = FlakyPynvml([device], {}, graphics={"GPU-a": graphics})
    [gpu] = NvmlReader(nvml, proc_root=tmp_path).read()
    assert [(p.pid, p.name, p.used_bytes, p.is_vllm) for p in gpu.processes] == [
        (10, "pid 10", None, False),  # no usedGpuMemory: unknown, not 0
        (20, "Xorg :0", GIB, False),  # the compute list's figure comes first
        (30, "python3 -m VLLM.entrypoints.openai.api_server", 5 * GIB, True),
        (40, "pid 40", None, False),
    ]


def test_a_command_line_that_is_not_utf8_is_shown_with_replacements(tmp_path: Path) -> None:
    _proc(tmp_path, 5, b"caf\xe9\0--vllm\0")
    [gpu] = NvmlReader(FakePynvml([FakeDevice(compute=[(5, GIB)])]), proc_root=tmp_path).read()
    assert [(p.name, p.is_vllm) for p in gpu.processes] == [("caf\ufffd --vllm", True)]


def test_nvml_is_started_once_however_often_it_is_read(tmp_path: Path) -> None:
    nvml = FakePynvml([FakeDevice(), FakeDevice(uuid="GPU-1")])
    reader = NvmlReader(nvml, proc_root=tmp_path)
    assert [len(reader.read()) for _ in range(3)] == [2, 2, 2]
    assert (nvml.calls["init"], nvml.calls["handle"]) == (1, 2)


def test_a_failing_init_says_why_and_is_tried_again_on_the_next_read() -> None:
    nvml = FakePynvml([FakeDevice()], init_error="Driver/library version mismatch")
    reader = NvmlReader(nvml)
    with pytest.raises(NvmlUnavailable) as failed:
        reader.read()
    assert failed.value.reason == "NVML init failed: Driver/library version mismatch"
    assert str(failed.value) == failed.value.reason
    nvml.init_error = None
    assert len(reader.read()) == 1 and nvml.calls["init"] == 2


def test_no_gpu_is_a_reason_each_time_it_is_read() -> None:
    reader = NvmlReader(FakePynvml([]))
    for _ in range(2):
        with pytest.raises(NvmlUnavailable) as failed:
            reader.read()
        assert failed.value.reason == "no NVIDIA GPU found"


def test_without_pynvml_the_reason_says_it_cannot_be_imported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(NvmlUnavailable) as failed:
        NvmlReader().read()
    assert failed.value.reason.startswith("pynvml not importable (")


def test_the_real_pynvml_without_a_driver_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pynvml")
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    monkeypatch.setattr(nvml_module, "_default_reader", NvmlReader())
    with pytest.raises(NvmlUnavailable) as failed:
        read_gpus()
    assert failed.value.reason.startswith("NVML init failed: ")
