"""NVIDIA dcgm-exporter (port 9400): one GPU per ``UUID``, and a MIG instance (``GPU_I_ID``)
as a GPU of its own.

Framebuffer fields are MiB. ``DCGM_FI_DEV_FB_TOTAL`` came with DCGM 3; before it the total is
used + free (+ reserved where exported). A MIG instance has no ``GPU_UTIL``: its graphics
engine activity (``PROF_GR_ENGINE_ACTIVE``, a ratio) stands in. DCGM writes "no data" as
huge sentinels (``DCGM_INT64_BLANK`` = 2^63 − 16…); those read as not exported. In
Kubernetes the exporter labels a GPU with the ``pod``/``namespace``/``container`` using it
(``exported_*`` when Prometheus renamed them on a clash).
"""

from __future__ import annotations

import math

from kvtop.collect.exposition import Exposition, Sample
from kvtop.collect.gpu import MAX_GPUS_PER_EXPORTER, MIB, GpuReading, Workload, over_cap_note
from kvtop.collect.reading import ServerReading

FB_USED, FB_FREE = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
FB_TOTAL, FB_RESERVED = "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_RESERVED"
UTIL, TEMP, POWER = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"
GR_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
NAMES = frozenset({FB_USED, FB_FREE, FB_TOTAL, FB_RESERVED, UTIL, TEMP, POWER, GR_ACTIVE})
BLANK_MIN = float(0x7FFFFFF0)  # DCGM_INT32_BLANK; the INT64 and FP64 blanks are larger still

GpuKey = tuple[str, str | None]  # (UUID, or gpu when there is none; GPU_I_ID)


def _label(sample: Sample, name: str) -> str | None:
    """A label's value, the ``exported_`` one first (Prometheus renames a clashing label);
    an empty value is no value."""
    labels = sample.labels
    return labels.get(f"exported_{name}") or labels.get(name) or None


def key_of(sample: Sample) -> GpuKey | None:
    device = sample.labels.get("UUID") or sample.labels.get("gpu")
    return None if device is None else (device, sample.labels.get("GPU_I_ID") or None)


def _value(value: float) -> float | None:
    return value if math.isfinite(value) and 0 <= value < BLANK_MIN else None


def _index(text: str | None) -> int | None:
    # "²" is a digit to str.isdigit() but not to int()
    ok = text is not None and text.isascii() and text.isdigit() and len(text) < 6
    return int(text) if ok else None  # type: ignore[arg-type]


class _Gpu:
    """What the samples of one GPU (or MIG instance) said, gathered in one pass."""

    __slots__ = ("first", "values", "workloads")

    def __init__(self, first: Sample) -> None:
        self.first = first  # its labels name the GPU
        self.values: dict[str, float | None] = {}
        self.workloads: dict[Workload, None] = {}  # in order, once each

    def add(self, sample: Sample) -> None:
        self.values[sample.name] = _value(sample.value)
        pod = _label(sample, "pod")
        if pod is not None:
            workload = Workload(_label(sample, "namespace"), pod, _label(sample, "container"))
            self.workloads[workload] = None

    def reading(self) -> GpuReading:
        labels, values = self.first.labels, self.values
        used, free = values.get(FB_USED), values.get(FB_FREE)
        total = values.get(FB_TOTAL)
        if total is None and used is not None and free is not None:
            total = used + free + (values.get(FB_RESERVED) or 0.0)
        util = values.get(UTIL)
        if util is None and values.get(GR_ACTIVE) is not None:
            util = 100.0 * values[GR_ACTIVE]  # type: ignore[operator]
        return GpuReading(
            index=_index(labels.get("gpu")),
            name=labels.get("modelName") or "GPU",
            uuid=labels.get("UUID", ""),
            memory_used_bytes=None if used is None else int(used * MIB),
            memory_total_bytes=None if total is None else int(total * MIB),
            util_percent=util if util is not None and util <= 100 else None,
            temperature_c=values.get(TEMP),
            power_w=values.get(POWER),
            source="dcgm",
            host=labels.get("Hostname") or None,
            mig_instance=labels.get("GPU_I_ID") or None,
            mig_profile=labels.get("GPU_I_PROFILE") or None,
            workloads=tuple(self.workloads),
        )


def read_gpus(expo: Exposition) -> list[GpuReading]:
    gpus: dict[GpuKey, _Gpu] = {}
    for name in sorted(NAMES):
        for sample in expo.series(name):
            key = key_of(sample)
            if key is None:
                continue  # a label-less sample names no GPU
            gpu = gpus.get(key)
            if gpu is None:
                gpu = gpus[key] = _Gpu(sample)
            gpu.add(sample)
    return sorted((gpu.reading() for gpu in gpus.values()), key=_order)


def _order(gpu: GpuReading) -> tuple[str, int, str, int]:
    """By host, GPU number, then the whole GPU before its MIG instances."""
    instance = _index(gpu.mig_instance)
    return (gpu.host or "", -1 if gpu.index is None else gpu.index, gpu.uuid,
            -1 if instance is None else instance)


def adapt(expo: Exposition, version: str | None = None) -> ServerReading:
    gpus = read_gpus(expo)
    notes = [] if gpus else ["dcgm-exporter: no GPU's memory, use, temperature or power"]
    notes += over_cap_note("dcgm-exporter", len(gpus))
    return ServerReading("dcgm", version=version, notes=notes,
                         gpus=gpus[:MAX_GPUS_PER_EXPORTER])
