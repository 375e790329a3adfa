"""What kvtop knows about one GPU, wherever it was read: local NVML, or an exporter that a
target (or Prometheus) serves (NVIDIA's dcgm-exporter, utkuozdemir's nvidia_gpu_exporter).

A field a source does not give is ``None`` ("not exported", never 0). Names, hosts and pod
labels from exporters are outside text: the views pass them through
:func:`kvtop.safe_text.display_text`; JSON keeps them exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

GpuSource = Literal["nvml", "dcgm", "nvidia_gpu_exporter"]
MIB = 2**20


# GPUs one exporter may report: a node holds 8 or 16, each split in at most 7 MIG instances;
# an exporter naming more (1,000 new ones a scrape) is broken or hostile, and the first
# ones (in its order) are kept.
MAX_GPUS_PER_EXPORTER = 256


def over_cap_note(kind: str, found: int) -> list[str]:
    """The note of an exporter that named more GPUs than kvtop keeps."""
    if found <= MAX_GPUS_PER_EXPORTER:
        return []
    return [f"{kind}: {found:,} GPUs; the first {MAX_GPUS_PER_EXPORTER} are shown "
            "(more is not one node's)"]


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    name: str  # the command line (NVML, from /proc), the process name (an exporter), or "pid N"
    used_bytes: int | None  # GPU memory; None where the source does not say
    is_vllm: bool


@dataclass(frozen=True, slots=True)
class Workload:
    """A Kubernetes container that dcgm-exporter says is using the GPU."""

    namespace: str | None
    pod: str
    container: str | None


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int | None  # the GPU's number on its host; None when an exporter's label is not one
    name: str
    uuid: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    util_percent: float | None
    temperature_c: float | None
    power_w: float | None
    processes: tuple[GpuProcess, ...] = ()
    source: GpuSource = "nvml"
    host: str | None = None  # the exporter's Hostname label; None: the machine it was read on
    mig_instance: str | None = None  # GPU_I_ID: a MIG instance is a GPU of its own
    mig_profile: str | None = None  # e.g. "1g.5gb"
    workloads: tuple[Workload, ...] = ()

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        """Tells GPUs apart across sources: the UUID (or index), and the MIG instance."""
        return normal_uuid(self.uuid) or f"#{self.index}", self.host, self.mig_instance


def normal_uuid(uuid: str) -> str:
    """NVML and dcgm write ``GPU-6f2a…``; nvidia_gpu_exporter lower-cases it and drops
    ``GPU-``. One spelling, so the same GPU read two ways is recognised."""
    text = uuid.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def process_json(process: GpuProcess) -> dict[str, Any]:
    return {"pid": process.pid, "name": process.name,
            "used_gpu_memory_bytes": process.used_bytes, "is_vllm": process.is_vllm}


def gpu_to_json(gpu: GpuReading) -> dict[str, Any]:
    """A GPU reading for the snapshot JSON (bytes, percent, °C, W; null when unknown)."""
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "memory_used_bytes": gpu.memory_used_bytes,
        "memory_total_bytes": gpu.memory_total_bytes,
        "utilization_percent": gpu.util_percent,
        "temperature_c": gpu.temperature_c,
        "power_w": gpu.power_w,
        "processes": [process_json(p) for p in gpu.processes],
        "source": gpu.source,
        "host": gpu.host,
        "mig": None if gpu.mig_instance is None else {"instance": gpu.mig_instance,
                                                      "profile": gpu.mig_profile},
        "kubernetes": [{"namespace": w.namespace, "pod": w.pod, "container": w.container}
                       for w in gpu.workloads],
    }
