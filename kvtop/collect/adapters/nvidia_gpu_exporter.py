"""utkuozdemir/nvidia_gpu_exporter (port 9835): ``nvidia-smi --query-gpu`` as metrics.

Names follow nvidia-smi's fields: MiB become ``*_bytes``, percentages ``*_ratio`` (0..1).
Every series carries the GPU's ``uuid`` (lower case, without ``GPU-``); the name and
index sit on ``nvidia_smi_gpu_info`` (1.3+) or, before, a ``name`` label on every series and
``nvidia_smi_index``. From 1.4 processes come as ``nvidia_smi_compute_app_*``. The exporter
has no host label: the host is the target's.
"""

from __future__ import annotations

import math

from kvtop.collect.exposition import Exposition, Sample
from kvtop.collect.gpu import MAX_GPUS_PER_EXPORTER, GpuProcess, GpuReading, over_cap_note
from kvtop.collect.reading import ServerReading

USED, TOTAL = "nvidia_smi_memory_used_bytes", "nvidia_smi_memory_total_bytes"
UTIL, TEMP = "nvidia_smi_utilization_gpu_ratio", "nvidia_smi_temperature_gpu"
POWER, INFO, INDEX = "nvidia_smi_power_draw_watts", "nvidia_smi_gpu_info", "nvidia_smi_index"
APP_INFO, APP_MEMORY = "nvidia_smi_compute_app_info", "nvidia_smi_compute_app_used_memory_bytes"
VALUES = (USED, TOTAL, UTIL, TEMP, POWER, INDEX)
NAMES = frozenset({*VALUES, INFO, APP_INFO, APP_MEMORY})
MAX_INDEX = 100_000
MAX_PROCESSES = 256  # per GPU: more is a broken or hostile exporter, not a GPU


def _value(sample: Sample) -> float | None:
    value = sample.value
    return value if math.isfinite(value) and value >= 0 else None


def _int(text: str | None) -> int | None:
    # "²" is a digit to str.isdigit() but not to int()
    ok = text is not None and text.isascii() and text.isdigit() and len(text) < 10
    return int(text) if ok else None  # type: ignore[arg-type]


def _by_uuid(expo: Exposition) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for name in VALUES:
        for sample in expo.series(name):
            uuid = sample.labels.get("uuid")
            if uuid is not None:
                out.setdefault(uuid, {})[name] = _value(sample)
    return out


def _names(expo: Exposition) -> dict[str, tuple[str | None, int | None]]:
    """uuid -> (name, index) from gpu_info, else from the name label older releases put on
    every series."""
    out: dict[str, tuple[str | None, int | None]] = {}
    for sample in expo.series(INFO):
        labels = sample.labels
        if "uuid" in labels:
            out[labels["uuid"]] = (labels.get("name") or None, _int(labels.get("index")))
    for sample in expo.series(USED):
        labels = sample.labels
        if labels.get("uuid") not in out and labels.get("name"):
            out[labels["uuid"]] = (labels["name"], None)
    return out


def _processes(expo: Exposition) -> dict[str, list[GpuProcess]]:
    used: dict[tuple[str, int], float | None] = {}
    names: dict[tuple[str, int], str] = {}
    for name in (APP_INFO, APP_MEMORY):
        for sample in expo.series(name):
            labels = sample.labels
            pid = _int(labels.get("pid"))
            if pid is None or "uuid" not in labels:
                continue
            key = (labels["uuid"], pid)
            names[key] = labels.get("process_name") or f"pid {pid}"
            if name == APP_MEMORY:
                used[key] = _value(sample)
    out: dict[str, list[GpuProcess]] = {}
    for (uuid, pid), name in sorted(names.items()):
        memory = used.get((uuid, pid))
        processes = out.setdefault(uuid, [])
        if len(processes) < MAX_PROCESSES:
            processes.append(GpuProcess(pid, name, None if memory is None else int(memory),
                                        "vllm" in name.lower()))
    return out


def read_gpus(expo: Exposition) -> list[GpuReading]:
    names, processes = _names(expo), _processes(expo)
    gpus = []
    for uuid, values in _by_uuid(expo).items():
        name, index = names.get(uuid, (None, None))
        number = values.get(INDEX)
        if index is None and number is not None and number < MAX_INDEX:
            index = int(number)
        used, total, util = values.get(USED), values.get(TOTAL), values.get(UTIL)
        gpus.append(GpuReading(
            index=index,
            name=name or "GPU",
            uuid=uuid,
            memory_used_bytes=None if used is None else int(used),
            memory_total_bytes=None if total is None else int(total),
            util_percent=None if util is None or util > 1 else 100.0 * util,
            temperature_c=values.get(TEMP),
            power_w=values.get(POWER),
            processes=tuple(processes.get(uuid, ())),
            source="nvidia_gpu_exporter",
        ))
    return sorted(gpus, key=lambda g: (-1 if g.index is None else g.index, g.uuid))


def adapt(expo: Exposition, version: str | None = None) -> ServerReading:
    gpus = read_gpus(expo)
    notes = [] if gpus else ["nvidia_gpu_exporter: no GPU's memory, use, temperature or power"]
    notes += over_cap_note("nvidia_gpu_exporter", len(gpus))
    return ServerReading("nvidia_gpu_exporter", version=version, notes=notes,
                         gpus=gpus[:MAX_GPUS_PER_EXPORTER])
