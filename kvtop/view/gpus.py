"""The GPU views' model: GPU views -> the GPU pane's lines, the table's GPU column and the
engine pane's GPU memory line. Pure functions, so the widgets only draw.

Names, UUIDs, hosts, pods and process command lines come from outside (exporters, /proc):
each goes through :func:`display_text` here, the one place these views take them in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from kvtop.collect.gpu import GpuReading
from kvtop.derive.gpu_owners import GpuSource, GpuView, Owner
from kvtop.safe_text import display_text
from kvtop.view import format as fmt
from kvtop.view.cells import Cell
from kvtop.view.chart import Point, bins, spark_rows

Piece = tuple[str, str]  # (text, role): the pane maps a role to a component style
Line = list[Piece]
GIB = 2**30
MAX_NAME = 80  # cells; the pane cuts lines at its width anyway
SOURCE_LABEL = {"dcgm": "dcgm-exporter", "nvidia_gpu_exporter": "nvidia_gpu_exporter"}
NOTE_CHARS = 40  # the header's GPU note: one short line
GpuKey = tuple[str, "str | None", "str | None"]


MAX_TRAILS = 1024  # GPUs with a history at once: four exporters at their cap


class GpuTrails:
    """Each GPU's memory used over the last ``span_s``: the history line under its bar. A
    GPU not seen for the span is forgotten, and at most ``MAX_TRAILS`` are kept (those seen
    least recently go first): an exporter naming new GPUs every scrape grew it forever."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self._trails: dict[GpuKey, deque[Point]] = {}

    def record(self, t: float, views: Sequence[GpuView]) -> None:
        for view in views:
            trail = self._trails.pop(view.gpu.key, None) or deque()
            self._trails[view.gpu.key] = trail  # newest last: the dict is in recency order
            trail.append((t, view.gpu.memory_used_bytes))
            while trail and t - trail[0][0] > self.span_s:
                trail.popleft()
        for key in [key for key, trail in self._trails.items()
                    if not trail or t - trail[-1][0] > self.span_s]:
            del self._trails[key]
        for key in list(self._trails)[:max(0, len(self._trails) - MAX_TRAILS)]:
            del self._trails[key]

    def __len__(self) -> int:
        return len(self._trails)

    def of(self, gpu: GpuReading) -> Sequence[Point]:
        return self._trails.get(gpu.key, ())


def gpu_note(nvml_unavailable: str | None, failed: Sequence[GpuSource],
             any_gpu: bool) -> tuple[str, str] | None:
    """The header's one short line about GPUs that could not be read (never a pane):
    (short, with the reason)."""
    short, full = [], []
    if nvml_unavailable is not None:
        reason = _text(nvml_unavailable.removeprefix("NVML init failed: "))
        short.append("no NVML")
        full.append("no NVML" if any_gpu else f"NVML: {reason}")
    if failed:
        count = f"{len(failed)} exporter{'' if len(failed) == 1 else 's'} failing"
        short.append(count)
        full.append(count)
    if not short:
        return None
    note = "; ".join(full)
    if len(note) > NOTE_CHARS:
        note = note[:NOTE_CHARS - 1] + "…"
    return "; ".join(short), note


def _text(value: object) -> str:
    return display_text(value, MAX_NAME)


def _title(view: GpuView) -> Line:
    gpu = view.gpu
    number = "?" if gpu.index is None else str(gpu.index)
    title = f"GPU{number} {_text(gpu.name)}"
    if gpu.mig_instance is not None:
        title += f" MIG {_text(gpu.mig_instance)}"
        if gpu.mig_profile:
            title += f" {_text(gpu.mig_profile)}"
    if view.target is not None:  # an exporter's GPU: say where it is
        title = f"{_text(view.host or '?')} {title}"
    return [(title, "title")]


def _numbers(view: GpuView, trails: GpuTrails | None, now: float, cells: int) -> list[Line]:
    gpu = view.gpu
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    share = used / total if used is not None and total else None
    util = fmt.DASH if gpu.util_percent is None else f"{gpu.util_percent:.0f}%"
    temp = fmt.DASH if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C"
    power = fmt.DASH if gpu.power_w is None else f"{gpu.power_w:.0f}W"
    lines: list[Line] = [
        [(f" mem {fmt.bar(share, 8)} {fmt.bytes_gib(used)}/{fmt.bytes_gib(total)} GiB", "")],
    ]
    width = cells - 9
    # memory over time, 0 to the GPU's total
    if trails is not None and total and width >= 8 and (trail := trails.of(gpu)):
        [spark] = spark_rows(bins(trail, now, trails.span_s, width), float(total), 1)
        lines.append([(" ", ""), (spark, "spark"), (f" {fmt.age(trails.span_s)}", "dim")])
    lines.append([(f" util {util}  {temp}  {power}", "")])
    return lines


def _owner_names(owners: Sequence[Owner]) -> str:
    return ", ".join(_text(owner.label) for owner in owners)


def _owners(view: GpuView) -> list[Line]:
    lines: list[Line] = []
    if view.owners and view.owners[0].by != "process":  # process owners are on their lines
        how = "same pod" if view.owners[0].by == "pod" else "same host"
        lines.append([(" serves ", "dim"), (_owner_names(view.owners), "owner"),
                      (f" ({how})", "dim")])
    for workload in view.gpu.workloads:
        where = "/".join(_text(p) for p in (workload.namespace, workload.pod,
                                            workload.container) if p)
        lines.append([(f" pod {where}", "dim")])
    return lines


def _processes(view: GpuView) -> list[Line]:
    gpu = view.gpu
    if not gpu.processes:
        return [] if view.target is not None else [[(" no processes", "dim")]]
    lines = []
    for proc in gpu.processes:
        mem = fmt.DASH if proc.used_bytes is None else f"{proc.used_bytes / GIB:.1f}G"
        line: Line = [(f" {proc.pid:>7} {mem:>6} ", "")]
        owner = view.process_owners.get(proc.pid)
        if owner is not None:
            line.append((f"{_text(owner.label)} ", "owner"))
        if proc.is_vllm:
            line.append(("vLLM ", "vllm"))
        line.append((_text(proc.name), "vllm" if proc.is_vllm else ""))
        lines.append(line)
    return lines


def pane_lines(views: Sequence[GpuView], failed: Sequence[GpuSource] = (), *,
               trails: GpuTrails | None = None, now: float = 0.0, cells: int = 0) -> list[Line]:
    """Per GPU: title, memory (with its history over ``cells`` when ``trails`` are
    given), use, owners and processes (each process with the server it belongs to); then
    why an exporter gave nothing (NVML's absence is the header's note, :func:`gpu_note`)."""
    lines: list[Line] = []
    for source in failed:
        what = SOURCE_LABEL.get(source.source, source.source)
        lines.append([(f"{what} {_text(source.host or '')}: {_text(source.error or 'failed')}",
                       "bad")])
    for view in views:
        if lines:
            lines.append([])
        lines += [_title(view), *_numbers(view, trails, now, cells), *_owners(view),
                  *_processes(view)]
    if not lines:
        lines.append([("no GPU found", "dim")])
    return lines


def owned_cell(owned: tuple[int | None, int | None] | None) -> Cell:
    """The table's GPU column: memory in use on the server's GPUs, as nvidia-smi shows it."""
    if owned is None:
        return Cell(fmt.DASH, "dim")
    used, total = owned
    if used is None:
        return Cell(fmt.DASH)
    if total is None:
        return Cell(f"{used / GIB:.0f}G")
    return Cell(f"{used / GIB:.0f}/{total / GIB:.0f}G")


def memory_tail(owned: tuple[int | None, int | None] | None) -> str:
    """What follows the GPU memory sparkline: the latest used/total."""
    if owned is None:
        return " no GPU found for this server"
    used, total = owned
    return f" {fmt.bytes_gib(used)}/{fmt.bytes_gib(total)} GiB  what nvidia-smi sees"


def failed_sources(sources: Sequence[GpuSource]) -> list[GpuSource]:
    return [source for source in sources if source.status == "failed"]


def memory_top(series: Sequence[tuple[float, int | None, int | None]],
               owned: tuple[int | None, int | None] | None) -> float:
    """The sparkline's full scale: the GPUs' total memory (else the largest use seen)."""
    if owned is not None and owned[1]:
        return float(owned[1])
    return float(max((used for _, used, _ in series if used), default=0))

