"""The app's GPUs: NVML read in a worker thread, one read at a time and re-armed after each
(dolphie's pattern: reads never pile up, a slow driver call never freezes the screen), which
server owns each GPU (its processes' ports, from /proc, cached), and what each server's GPUs
use over time. Exporters' GPUs come with their scrapes; owners are worked out again when a
server or exporter is new (at once) or an exporter's GPUs moved (at most every 2 s).

It draws nothing: the app shows what it holds after each refresh (``on_refresh``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from kvtop.collect.nvml import GpuReader, NvmlUnavailable
from kvtop.collect.ownership import PortOwners
from kvtop.collect.reading import GPU_EXPORTER_KINDS
from kvtop.derive.gpu_owners import (
    GpuMemoryHistory,
    GpuSource,
    GpuView,
    exporter_sources,
    gpu_views,
    local_ports,
    nvml_source,
    owned_memory,
)
from kvtop.safe_text import display_text
from kvtop.view.gpus import GpuTrails, failed_sources, gpu_note

if TYPE_CHECKING:
    from textual.app import App

    from kvtop.collect.gpu import GpuReading
    from kvtop.derive.tracker import TargetState

GPU_MIN_PERIOD_S = 2.0  # NVML reads are costly (gpustat#54); no need to go faster
OwnedMemory = dict[str, tuple["int | None", "int | None"]]  # server URL -> (used, total) bytes


class GpuWatch:
    def __init__(self, app: App[Any], reader: GpuReader | None, *, history_s: float,
                 clock: Callable[[], float], states: Callable[[], list[TargetState]],
                 period_s: Callable[[], float], on_screen: Callable[[], bool],
                 on_refresh: Callable[[bool], None]) -> None:
        """``reader``: NVML's (None: --no-gpu, exporters only); ``states``: the servers
        now; ``period_s``: the poll interval (reads come at most that often, and never more
        than every 2 s); ``on_refresh(redraw)``: called after each refresh while the app is on
        screen, redraw True when the rows or header say something new (owners, the NVML note)."""
        self._app = app
        self._reader = reader
        self._clock = clock
        self._states = states
        self._period_s = period_s
        self._on_screen = on_screen
        self._on_refresh = on_refresh
        self.gpus: list[GpuReading] = []  # local, from NVML
        self.unavailable: str | None = None  # why NVML could not be read
        self._nvml_failed = False  # NVML there but broken, not merely absent
        # Every GPU (NVML and exporters) with its owners, and what each server's GPUs use
        self.views: list[GpuView] = []
        self.owned: OwnedMemory = {}
        self.history = GpuMemoryHistory(history_s)  # per server, under its sparkline
        self.trails = GpuTrails(history_s)  # per GPU, under its bar in the pane
        self.failed_sources: list[GpuSource] = []  # exporters that could not be read
        self._pid_owners: dict[int, str] = {}  # local GPU process -> server URL
        self._port_owners = PortOwners()  # used by the worker thread only
        self._exporters_changed = False  # an exporter's GPUs moved: owners at most every 2 s
        self._servers_changed = True  # a new server or exporter (all, at first): owners at once
        self._refreshed_at = float("-inf")  # monotonic time of the last refresh

    # -- what the app tells it ------------------------------------------------------------

    def scraped(self, first: bool, kind: str | None) -> None:
        """A scrape was folded: a target's first (a new server to own GPUs, or new GPUs),
        or an exporter's (its GPUs' numbers moved)."""
        if first:
            self._servers_changed = True
        elif kind in GPU_EXPORTER_KINDS:
            self._exporters_changed = True

    def refresh_if_due(self) -> None:
        """At each frame (even paused: the memory history is collection too)."""
        due = time.monotonic() - self._refreshed_at >= GPU_MIN_PERIOD_S
        if self._servers_changed or (self._exporters_changed and due):
            self.refresh()

    # -- NVML, in a worker thread -----------------------------------------------------------

    def start(self) -> None:
        if self._reader is not None:
            self.read()

    def read(self) -> None:
        """One NVML read in a thread; its result re-arms the next."""
        ports = local_ports(state.target for state in self._states())
        self._app.run_worker(partial(self._read_in_thread, ports), name="read_gpus",
                             group="gpu", exclusive=True, thread=True, exit_on_error=False)

    def _read_in_thread(self, ports: dict[int, str]) -> None:
        """NVML, and which server each GPU process belongs to (/proc, cached)."""
        assert self._reader is not None
        try:
            gpus = self._reader.read()
        except NvmlUnavailable as exc:
            self._app.call_from_thread(self.read_failed, exc.reason)
            return
        except Exception as exc:  # a driver error must not take the app down
            self._app.call_from_thread(self.read_failed, f"{type(exc).__name__}: {exc}", True)
            return
        pids = [process.pid for gpu in gpus for process in gpu.processes]
        try:
            owners = self._port_owners.owners(pids, ports)  # no pids: /proc is not read
        except Exception:  # /proc surprises cost the owner column, never the GPU pane
            owners = {}
        self._app.call_from_thread(self.read_done, gpus, owners)

    def read_done(self, gpus: list[GpuReading], owners: dict[int, str] | None = None) -> None:
        self.gpus = gpus
        self._pid_owners = owners or {}
        self.refresh()
        self._app.set_timer(max(GPU_MIN_PERIOD_S, self._period_s()), self.read)

    def read_failed(self, reason: str, failed: bool = False) -> None:
        """Said once (in the header), not retried every tick."""
        self.unavailable = reason
        self._nvml_failed = failed
        self.refresh(news=True)  # the header's GPU note: drawn now, not at the next scrape

    # -- owners ---------------------------------------------------------------------------

    def refresh(self, *, news: bool = False) -> None:
        """Work out every GPU's owners again (new GPU readings or servers) and remember
        what each server's GPUs use; ``news``: what the header says of GPUs changed."""
        self._exporters_changed = self._servers_changed = False
        self._refreshed_at = time.monotonic()
        if not self._on_screen():
            return
        states = self._states()
        owners_before = self.owned.keys()
        self.views = gpu_views(self.gpus, self._pid_owners, states)
        self.owned = owned_memory(self.views)
        self.history.record(self._clock(), self.owned)
        self.trails.record(self._clock(), self.views)
        self.failed_sources = failed_sources(exporter_sources(states))
        self._on_refresh(news or self.owned.keys() != owners_before)

    # -- what it says ---------------------------------------------------------------------

    def note(self) -> tuple[str, str] | None:
        """The header's GPU note (short, full), if there is something to say (nothing with
        --no-gpu)."""
        if self._reader is None:
            return None
        return gpu_note(self.unavailable, self.failed_sources, bool(self.views))

    def why_no_pane(self, *, demo: bool) -> str | None:
        """Why ``g`` has no GPU pane to show (None: it has one)."""
        if self.views or self.failed_sources:
            return None
        if demo:
            return "no GPU pane: the demo's servers are simulated and own no GPU"
        if self._reader is None:
            return "no GPU pane: --no-gpu (a GPU exporter as a target still shows its GPUs)"
        if self.unavailable is not None:
            return (f"no GPU pane: no local GPU ({display_text(self.unavailable, 80)}); add "
                    "a GPU exporter "
                    "(dcgm-exporter, nvidia_gpu_exporter) as a target")
        return "no GPU pane: no GPU read yet"

    def sources(self, states: list[TargetState]) -> list[GpuSource]:
        """Where GPUs were read from, for the snapshot: NVML (read, absent or broken;
        unless --no-gpu), then each exporter."""
        sources = exporter_sources(states)
        if self._reader is not None:
            sources.insert(0, nvml_source(len(self.gpus), self.unavailable,
                                          failed=self._nvml_failed))
        return sources
