"""Local GPUs through NVML (the ``pynvml`` module of nvidia-ml-py): the only NVML code in kvtop.

NVML calls can be slow (gpustat#54, nvtop#139), so callers run :meth:`NvmlReader.read` in a
thread, never on the UI thread. NVML is initialised once and device handles are cached;
a field a device does not support is remembered and not asked again.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from kvtop.collect.gpu import GpuProcess, GpuReading, gpu_to_json

__all__ = ["GpuProcess", "GpuReader", "GpuReading", "NvmlReader", "NvmlUnavailable",
           "gpu_to_json", "read_gpus"]


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; ``reason`` says why (no library, no driver, no GPU)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class GpuReader(Protocol):
    """Anything that reads the local GPUs; raises :class:`NvmlUnavailable` when it can't."""

    def read(self) -> list[GpuReading]: ...


class NvmlReader:
    """Reads every local GPU through NVML. Thread-safe; one instance per process is enough."""

    def __init__(self, nvml: ModuleType | Any | None = None, proc_root: Path = Path("/proc")):
        # pynvml ships no types (and tests pass a fake of it): its calls are checked by the
        # tests, not by mypy. Set before any read: read() goes through _init().
        self._nvml: Any = nvml
        self._proc_root = proc_root
        self._handles: list[Any] | None = None
        self._unsupported: set[tuple[int, str]] = set()
        self._lock = threading.Lock()

    def read(self) -> list[GpuReading]:
        with self._lock:
            handles = self._init()
            return [self._read_device(i, h) for i, h in enumerate(handles)]

    def _init(self) -> list[Any]:
        if self._handles is not None:
            return self._handles
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise NvmlUnavailable(f"pynvml not importable ({exc})") from exc
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML init failed: {exc}") from exc
        if not handles:  # not kept: the next read says so again, never "0 GPUs, fine"
            raise NvmlUnavailable("no NVIDIA GPU found")
        self._handles = handles
        return handles

    def _field(self, index: int, field: str, call: Any, *args: Any) -> Any:
        """One NVML query; None (and never asked again) when the device doesn't support it."""
        if (index, field) in self._unsupported:
            return None
        try:
            return call(*args)
        except self._nvml.NVMLError_NotSupported:
            self._unsupported.add((index, field))
        except self._nvml.NVMLError:
            pass
        return None

    def _read_device(self, index: int, handle: Any) -> GpuReading:
        nvml = self._nvml
        memory = self._field(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        util = self._field(index, "util", nvml.nvmlDeviceGetUtilizationRates, handle)
        temp = self._field(
            index, "temp", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        power_mw = self._field(index, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        return GpuReading(
            index=index,
            name=_text(self._field(index, "name", nvml.nvmlDeviceGetName, handle) or "GPU"),
            uuid=_text(self._field(index, "uuid", nvml.nvmlDeviceGetUUID, handle) or ""),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            util_percent=None if util is None else float(util.gpu),
            temperature_c=None if temp is None else float(temp),
            power_w=None if power_mw is None else power_mw / 1000.0,
            processes=self._processes(index, handle),
        )

    def _processes(self, index: int, handle: Any) -> tuple[GpuProcess, ...]:
        nvml = self._nvml
        found: dict[int, int | None] = {}
        for field, call in (
            ("compute", nvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for proc in self._field(index, field, call, handle) or ():
                used = getattr(proc, "usedGpuMemory", None)
                found.setdefault(int(proc.pid), None if used is None else int(used))
        return tuple(self._process(pid, used) for pid, used in sorted(found.items()))

    def _process(self, pid: int, used: int | None) -> GpuProcess:
        cmdline = _cmdline(self._proc_root, pid)
        return GpuProcess(
            pid=pid,
            name=cmdline or f"pid {pid}",
            used_bytes=used,
            is_vllm="vllm" in cmdline.lower(),
        )


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _cmdline(proc_root: Path, pid: int) -> str:
    """The process's argv joined by spaces; empty when it can't be read (another namespace)."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


_default_reader = NvmlReader()


def read_gpus() -> list[GpuReading]:
    """Read the local GPUs with the process-wide reader (NVML initialised once)."""
    return _default_reader.read()
