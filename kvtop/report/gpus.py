"""GPUs for headless output: local NVML (when asked) and every GPU exporter among the
targets, each with its owners, and where GPUs were looked for with what came of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtop.collect.gpu import GpuReading
from kvtop.collect.nvml import GpuReader, NvmlUnavailable, read_gpus
from kvtop.collect.ownership import PortOwners
from kvtop.derive.gpu_owners import (
    exporter_sources,
    gpu_views,
    local_ports,
    nvml_source,
    source_json,
    view_json,
)
from kvtop.derive.tracker import TargetState

GpuJson = list[dict[str, Any]]


def gpu_report(states: Sequence[TargetState], *, with_nvml: bool = True,
               reader: GpuReader | None = None,
               port_owners: PortOwners | None = None) -> tuple[GpuJson, GpuJson]:
    """(``gpus``, ``gpu_sources``) of the snapshot JSON."""
    local: list[GpuReading] = []
    sources = []
    if with_nvml:
        error, failed = None, False
        try:
            local = reader.read() if reader is not None else read_gpus()
        except NvmlUnavailable as exc:
            error = exc.reason
        except Exception as exc:  # a driver error is reported, not raised
            error, failed = f"{type(exc).__name__}: {exc}", True
        sources.append(nvml_source(len(local), error, failed=failed))
    pids = [process.pid for gpu in local for process in gpu.processes]
    owners = {}
    if pids:
        ports = local_ports(state.target for state in states)
        owners = (port_owners or PortOwners()).owners(pids, ports)
    views = gpu_views(local, owners, states)
    sources += exporter_sources(states)
    return [view_json(view) for view in views], [source_json(source) for source in sources]
