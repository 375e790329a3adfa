"""Every GPU kvtop can see (local NVML and GPU exporters), each with the watched servers that
own it, and how that is known.

* ``process``: a local GPU process is, or descends from, the process listening on the
  server's port (:class:`kvtop.collect.ownership.PortOwners`). Exact.
* ``pod``: dcgm-exporter says which Kubernetes pod uses the GPU, and the server's series in
  Prometheus carry the same pod (and namespace) label.
* ``host``: the GPU is on the machine the server runs on: the exporter's ``Hostname`` label
  or the exporter's own address is the server's host. Several servers on one host all own
  all its GPUs, as far as kvtop can tell.

The strongest kind of evidence a GPU has is the only one used.
"""

from __future__ import annotations

import ipaddress
import socket
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal
from urllib.parse import urlsplit

from kvtop.collect.gpu import GpuReading, gpu_to_json
from kvtop.collect.reading import GPU_EXPORTER_KINDS
from kvtop.collect.target import Target
from kvtop.derive.tracker import TargetState

OwnedBy = Literal["process", "pod", "host"]
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"})
POD_LABELS = ("pod", "kubernetes_pod_name", "pod_name")
NAMESPACE_LABELS = ("namespace", "kubernetes_namespace")


@dataclass(frozen=True, slots=True)
class Owner:
    url: str  # the server's target URL (its identity)
    label: str  # its row name
    by: OwnedBy


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU as the views and the snapshot show it."""

    gpu: GpuReading
    host: str | None  # where the GPU is: its exporter's Hostname, else the reader's host
    target: str | None  # the exporter target it came from; None for local NVML
    owners: tuple[Owner, ...] = ()
    process_owners: Mapping[int, Owner] = field(default_factory=dict)  # pid -> owner


@dataclass(frozen=True, slots=True)
class GpuSource:
    """One place GPUs are read from, and whether that worked: an empty GPU list then says
    "none there" or "could not ask", never both."""

    source: str  # "nvml", or the exporter's kind
    target: str | None  # the exporter target; None for NVML
    host: str | None
    status: Literal["ok", "unavailable", "failed"]
    error: str | None
    gpus: int


@lru_cache(maxsize=1)
def local_host() -> str:
    return socket.gethostname()


@lru_cache(maxsize=4096)
def target_host(target: Target) -> str | None:
    """The host a target runs on: the URL's, or for a Prometheus instance
    (``<prom>#job/instance``) the instance's."""
    parts = urlsplit(target.url)
    if parts.fragment and "/" in parts.fragment:
        instance = parts.fragment.split("/", 1)[1]
        try:  # an instance label is whatever Prometheus was told: "[::1]:80", or hostile
            return urlsplit(f"//{instance}").hostname or instance or None
        except ValueError:
            return instance or None
    try:
        return parts.hostname
    except ValueError:
        return None


@lru_cache(maxsize=4096)
def target_port(target: Target) -> int | None:
    parts = urlsplit(target.url)
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


@lru_cache(maxsize=4096)
def same_host_key(host: str | None) -> str | None:
    """Host names compared loosely: case, a trailing dot and the domain don't matter, and
    this machine's loopback names are one."""
    if not host:
        return None
    name = host.strip().lower().rstrip(".").strip("[]")
    if name in LOOPBACK or name == local_host().lower():
        return "localhost"
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.split(".", 1)[0]


def is_local(target: Target) -> bool:
    return same_host_key(target_host(target)) == "localhost" and "#" not in target.url


def local_ports(targets: Iterable[Target]) -> dict[int, str]:
    """port -> target URL of the servers on this machine: what PortOwners looks for."""
    ports = {}
    for target in targets:
        port = target_port(target)
        if port is not None and is_local(target):
            ports[port] = target.url
    return ports


def _pod_of(state: TargetState) -> tuple[str | None, str] | None:
    """(namespace, pod) from the labels Prometheus put on a server's series, if any."""
    scrape = state.last_good
    if scrape is None or scrape.samples is None or not scrape.samples.samples:
        return None
    labels = scrape.samples.samples[0].labels
    pod = next((labels[k] for k in POD_LABELS if labels.get(k)), None)
    if pod is None:
        return None
    return next((labels[k] for k in NAMESPACE_LABELS if labels.get(k)), None), pod


@dataclass(slots=True)
class _Servers:
    """The inference servers, indexed the ways GPUs are matched to them."""

    by_host: dict[str, list[Owner]] = field(default_factory=dict)
    by_pod: dict[tuple[str | None, str], list[Owner]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # url -> row name

    @classmethod
    def of(cls, states: Iterable[TargetState]) -> _Servers:
        servers = cls()
        for state in states:
            if state.kind in GPU_EXPORTER_KINDS or state.kind == "unknown":
                continue  # an exporter, or not an inference server: owns no GPU
            target = state.target
            servers.labels[target.url] = target.label
            host = same_host_key(target_host(target))
            if host is not None:
                servers.by_host.setdefault(host, []).append(
                    Owner(target.url, target.label, "host"))
            pod = _pod_of(state)
            if pod is not None:
                servers.by_pod.setdefault(pod, []).append(Owner(target.url, target.label, "pod"))
        return servers

    def pod_owners(self, gpu: GpuReading) -> list[Owner]:
        """Servers in a pod that dcgm-exporter says uses the GPU (a namespace missing on
        either side leaves the pod name to decide)."""
        return [owner for workload in gpu.workloads
                for (namespace, pod), owners in self.by_pod.items()
                if pod == workload.pod
                and (None in (namespace, workload.namespace) or namespace == workload.namespace)
                for owner in owners]

    def host_owners(self, *hosts: str | None) -> list[Owner]:
        keys = sorted({key for host in hosts if (key := same_host_key(host)) is not None})
        return [owner for key in keys for owner in self.by_host.get(key, ())]


def _unique(owners: Iterable[Owner]) -> tuple[Owner, ...]:
    return tuple({owner.url: owner for owner in owners}.values())


def gpu_views(local: Sequence[GpuReading], pid_owners: Mapping[int, str],
              states: Sequence[TargetState]) -> list[GpuView]:
    """Local NVML GPUs (owned through their processes) then every GPU exporter's GPUs
    (owned by pod, else by host), in target order."""
    servers = _Servers.of(states)
    views = []
    owners = {pid: Owner(url, servers.labels.get(url, url), "process")
              for pid, url in pid_owners.items()}
    for gpu in local:
        mine = {p.pid: owners[p.pid] for p in gpu.processes if p.pid in owners}
        views.append(GpuView(gpu, local_host(), None, _unique(mine.values()), mine))
    for state in states:
        if state.kind not in GPU_EXPORTER_KINDS:
            continue
        exporter_host = target_host(state.target)
        for gpu in state.gpus:
            found = servers.pod_owners(gpu) or servers.host_owners(gpu.host, exporter_host)
            views.append(GpuView(gpu, gpu.host or exporter_host, state.target.url,
                                 _unique(found)))
    return views


def nvml_source(gpus: int, error: str | None = None, *, failed: bool = False) -> GpuSource:
    """Local NVML: ``error`` says why it could not be read; ``failed`` tells a broken driver
    from plain absence (no library, no GPU)."""
    status = "ok" if error is None else "failed" if failed else "unavailable"
    return GpuSource("nvml", None, local_host(), status, error, gpus)


def exporter_sources(states: Iterable[TargetState]) -> list[GpuSource]:
    """Each target known to be a GPU exporter, read or not this time."""
    sources = []
    for state in states:
        if state.kind not in GPU_EXPORTER_KINDS:
            continue
        read = state.status == "up"
        sources.append(GpuSource(state.kind or "", state.target.url, target_host(state.target),
                                 "ok" if read else "failed", None if read else state.error,
                                 len(state.gpus)))
    return sources


def owned_memory(views: Sequence[GpuView]) -> dict[str, tuple[int | None, int | None]]:
    """target URL -> (used, total) bytes over the GPUs it owns; a part nobody reports makes
    the sum unknown, not smaller. A MIG instance is a slice of its GPU's memory: where the
    whole GPU is counted, its instances are not."""
    whole: dict[tuple[str, str | None], set[str]] = {}  # a whole GPU -> who counts it
    for view in views:
        if view.gpu.mig_instance is None and view.owners:
            whole.setdefault((view.gpu.key[0], view.host), set()).update(
                owner.url for owner in view.owners)
    sums: dict[str, tuple[int | None, int | None]] = {}
    for view in views:
        gpu = view.gpu
        counted = whole.get((gpu.key[0], view.host), ()) if gpu.mig_instance else ()
        for owner in view.owners:
            if owner.url in counted:
                continue
            used, total = sums.get(owner.url, (0, 0))
            sums[owner.url] = (_add(used, gpu.memory_used_bytes),
                               _add(total, gpu.memory_total_bytes))
    return sums


def _add(total: int | None, value: int | None) -> int | None:
    return None if total is None or value is None else total + value


MAX_HISTORIES = 4096  # servers with a GPU memory history at once


class GpuMemoryHistory:
    """Per server, the GPU memory its GPUs use over time (what nvidia-smi shows), for the
    engine pane's line under the KV pool's. A server not recorded for the span is
    forgotten, and at most ``MAX_HISTORIES`` are kept (those recorded least recently go
    first)."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self._series: dict[str, deque[tuple[float, int | None, int | None]]] = {}

    def record(self, t: float, owned: Mapping[str, tuple[int | None, int | None]]) -> None:
        for url, (used, total) in owned.items():
            series = self._series.pop(url, None) or deque()
            self._series[url] = series  # newest last: the dict is in recency order
            series.append((t, used, total))
            while series and t - series[0][0] > self.span_s:
                series.popleft()
        stale = [url for url, series in self._series.items()
                 if not series or t - series[-1][0] > self.span_s]
        stale += list(self._series)[:max(0, len(self._series) - len(stale) - MAX_HISTORIES)]
        for url in stale:
            self._series.pop(url, None)

    def __len__(self) -> int:
        return len(self._series)

    def series(self, url: str) -> Sequence[tuple[float, int | None, int | None]]:
        return self._series.get(url, ())


def owner_json(owner: Owner) -> dict[str, Any]:
    return {"target": owner.url, "label": owner.label, "by": owner.by}


def view_json(view: GpuView) -> dict[str, Any]:
    """A GPU for the snapshot JSON: the reading, where it was read, and who owns it."""
    entry = gpu_to_json(view.gpu)
    entry["host"] = view.host
    entry["target"] = view.target
    entry["owners"] = [owner_json(owner) for owner in view.owners]
    for process in entry["processes"]:
        owner = view.process_owners.get(process["pid"])
        process["owner"] = None if owner is None else owner_json(owner)
    return entry


def source_json(source: GpuSource) -> dict[str, Any]:
    return {"source": source.source, "target": source.target, "host": source.host,
            "status": source.status, "error": source.error, "gpus": source.gpus}
