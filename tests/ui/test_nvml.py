"""The NVML module against a fake pynvml: fields, caching, unsupported fields, no NVML."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtop.collect.nvml import NvmlReader, NvmlUnavailable, gpu_to_json
from tests.fakes.fake_nvml import GIB, FakeDevice, FakePynvml


def _proc(tmp_path: Path, pid: int, argv: list[str]) -> None:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_reads_devices_and_marks_vllm_processes(tmp_path: Path) -> None:
    _proc(tmp_path, 10, ["python3", "-m", "vllm.entrypoints.openai.api_server"])
    _proc(tmp_path, 11, ["python3", "train.py"])
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
