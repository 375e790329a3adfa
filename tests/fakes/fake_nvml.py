"""Fakes of NVML: a pynvml-shaped module for NvmlReader, and a GpuReader for the app."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvtop.collect.nvml import GpuProcess, GpuReading, NvmlUnavailable

GIB = 2**30


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


@dataclass
class FakeDevice:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-0000"
    used: int = 70 * GIB
    total: int = 80 * GIB
    util: int = 93
    temp: int = 61
    power_mw: int | None = 412_000  # None: "not supported"
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)


class FakePynvml:
    """Just enough of pynvml's surface for NvmlReader; counts calls to check caching."""

    NVMLError = FakeNVMLError
    NVMLError_NotSupported = FakeNotSupported
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices: list[FakeDevice], *, init_error: str | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self) -> None:
        self._count("init")
        if self.init_error:
            raise FakeNVMLError(self.init_error)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeDevice:
        self._count("handle")
        return self.devices[i]

    def nvmlDeviceGetName(self, d: FakeDevice) -> str:
        return d.name

    def nvmlDeviceGetUUID(self, d: FakeDevice) -> str:
        return d.uuid

    def nvmlDeviceGetMemoryInfo(self, d: FakeDevice) -> Any:
        return SimpleNamespace(used=d.used, total=d.total, free=d.total - d.used)

    def nvmlDeviceGetUtilizationRates(self, d: FakeDevice) -> Any:
        return SimpleNamespace(gpu=d.util, memory=0)

    def nvmlDeviceGetTemperature(self, d: FakeDevice, sensor: int) -> int:
        if sensor != self.NVML_TEMPERATURE_GPU:  # the GPU's is the one sensor there is
            raise FakeNVMLError("Invalid Argument")
        return d.temp

    def nvmlDeviceGetPowerUsage(self, d: FakeDevice) -> int:
        self._count("power")
        if d.power_mw is None:
            raise FakeNotSupported("Not Supported")
        return d.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, d: FakeDevice) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in d.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, d: FakeDevice) -> list[Any]:
        return []


def sample_gpus() -> list[GpuReading]:
    """Two GPUs: one serving vLLM (memory nearly full, as vLLM preallocates), one idle."""
    return [
        GpuReading(
            index=0,
            name="NVIDIA H100 80GB HBM3",
            uuid="GPU-aaaa",
            memory_used_bytes=74 * GIB,
            memory_total_bytes=80 * GIB,
            util_percent=91.0,
            temperature_c=63.0,
            power_w=512.0,
            processes=(
                GpuProcess(4242, "python3 -m vllm.entrypoints.openai.api_server", 73 * GIB, True),
                GpuProcess(5151, "python3 train.py", None, False),
            ),
        ),
        GpuReading(
            index=1,
            name="NVIDIA H100 80GB HBM3",
            uuid="GPU-bbbb",
            memory_used_bytes=0,
            memory_total_bytes=80 * GIB,
            util_percent=0.0,
            temperature_c=31.0,
            power_w=None,
        ),
    ]


class FakeGpuReader:
    """A GpuReader returning fixed readings, or raising NvmlUnavailable."""

    def __init__(
        self, gpus: list[GpuReading] | None = None, *, unavailable: str | None = None
    ) -> None:
        self.gpus = sample_gpus() if gpus is None else gpus
        self.unavailable = unavailable
        self.reads = 0

    def read(self) -> list[GpuReading]:
        self.reads += 1
        if self.unavailable:
            raise NvmlUnavailable(self.unavailable)
        return self.gpus
