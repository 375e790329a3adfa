"""The GPU views' model without a terminal: the GPU pane's lines (title, memory and its
history, use, owners, processes; why a source gave nothing), the history kept per GPU, the
header's note, the GPU column's cell and the engine pane's GPU memory line."""

from __future__ import annotations

import dataclasses

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.gpu import MAX_GPUS_PER_EXPORTER, GpuReading, Workload
from kvtop.derive.gpu_owners import GpuSource, GpuView, Owner, gpu_views, nvml_source
from kvtop.derive.stats import EngineStats
from kvtop.view import format as fmt
from kvtop.view import gpus as gpus_view
from kvtop.view.cells import Cell
from kvtop.view.chart import bins, spark_rows
from kvtop.view.gpus import (
    GpuTrails,
    failed_sources,
    gpu_note,
    memory_tail,
    memory_top,
    owned_cell,
    pane_lines,
)
from tests.fakes.fake_nvml import sample_gpus
from tests.scenarios.gpu import (
    DCGM_MIG,
    DCGM_POD,
    DCGM_T4,
    NVIDIA_SMI_H100,
    gpu_fixture,
    prometheus_state,
    server_state,
)
from tests.support.paths import fixture_text

GIB = 2**30
NOW, SPAN, CELLS = 10_000.0, 300.0, 30
VLLM = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
EXPORTER = "http://10.0.0.5:9400/metrics"


def test_kv_and_gpu_lines_share_one_time_axis() -> None:
    """vLLM takes its pool up front: nvidia-smi stays at 74 GiB while the pool fills. The
    engine pane draws the GPU's memory on the KV line's cells (the same bins)."""
    times = [NOW - SPAN + 10 * i for i in range(30)]
    kv = [EngineStats("m", "0", t, blocks_total=1000, blocks_used=30.0 * i)
          for i, t in enumerate(times)]
    gpu = [(t, 74 * GIB, 80 * GIB) for t in times]
    kv_cells = bins([(s.t, s.blocks_used) for s in kv], NOW, SPAN, CELLS)
    gpu_cells = bins([(t, used) for t, used, _ in gpu], NOW, SPAN, CELLS)
    assert [v is None for v in kv_cells] == [v is None for v in gpu_cells]  # same cells
    [kv_line] = spark_rows(kv_cells, 1000, 1)
    [gpu_line] = spark_rows(gpu_cells, memory_top(gpu, (74 * GIB, 80 * GIB)), 1)
    assert kv_line.strip()[0] in "▁▂" and kv_line.strip()[-1] == "▇"  # filling
    assert set(gpu_line.strip()) == {"▇"}  # a flat line


def test_gpu_column_cell() -> None:
    assert owned_cell(None) == Cell(fmt.DASH, "dim")  # no GPU of its own
    assert owned_cell((None, 80 * GIB)) == Cell(fmt.DASH)  # use unknown: not 0
    assert owned_cell((74 * GIB, 80 * GIB)) == Cell("74/80G")
    assert owned_cell((74 * GIB, None)) == Cell("74G")


def test_the_engine_panes_gpu_memory_line() -> None:
    """Its tail says the latest used/total (or that no GPU is the server's); its full scale
    is the GPUs' total, else the largest use seen, else 0."""
    assert memory_tail(None) == " no GPU found for this server"
    assert memory_tail((74 * GIB, 80 * GIB)) == " 74.0/80.0 GiB  what nvidia-smi sees"
    assert memory_tail((None, None)) == " –/– GiB  what nvidia-smi sees"
    series = [(1.0, 70 * GIB, None), (2.0, None, None), (3.0, 74 * GIB, None), (4.0, 0, None)]
    assert memory_top(series, (74 * GIB, 80 * GIB)) == 80.0 * GIB
    assert memory_top(series, None) == memory_top(series, (74 * GIB, None)) == 74.0 * GIB
    assert memory_top(series, (74 * GIB, 0)) == 74.0 * GIB  # a total of 0 is no total
    assert memory_top([(1.0, None, None), (2.0, 0, None)], None) == 0.0
    assert memory_top([], None) == 0.0


def test_pane_says_why_it_is_empty() -> None:
    assert pane_lines([]) == [[("no GPU found", "dim")]]


def test_pane_says_which_exporter_failed_and_why() -> None:
    """Each failed source by its exporter's name (dcgm's is "dcgm-exporter"), host and
    error; one without them says "failed"; a line between them and each GPU."""
    failed = [GpuSource("dcgm", EXPORTER, "10.0.0.5", "failed", "timeout after 5s", 0),
              GpuSource("nvidia_gpu_exporter", "http://b:9835/metrics", None, "failed", None,
                        0),
              GpuSource("other", "http://c:1/metrics", "c\x1b[2J", "failed", "bad\x07", 0)]
    [gpu] = read_exposition(gpu_fixture(DCGM_POD)).gpus
    lines = pane_lines([GpuView(gpu, None, EXPORTER)], failed)
    assert lines == [
        [("dcgm-exporter 10.0.0.5: timeout after 5s", "bad")],
        [("nvidia_gpu_exporter : failed", "bad")],
        [("other c\\x1b[2J: bad\\x07", "bad")],
        [],
        [("? GPU0 Tesla T4", "title")],
        [(" mem ········ –/– GiB", "")],
        [(" util 0%  –  –", "")],
        [(" pod foo/bar/baz", "dim")],
    ]


def test_pane_mig_instance_title() -> None:
    whole, instance = read_exposition(gpu_fixture(DCGM_MIG)).gpus
    views = [GpuView(gpu, gpu.host, "http://10.1.1.1:9400/metrics") for gpu in (whole, instance)]
    titles = [line[0][0] for line in pane_lines(views) if line and line[0][1] == "title"]
    assert titles == ["ub20-a100-k8s GPU0 GPU", "ub20-a100-k8s GPU0 GPU MIG 13 1g.5gb"]


def test_a_gpus_title() -> None:
    """A local GPU by its number and name; an exporter's with its host first; a MIG
    instance with its profile when known; a number or name from outside as safe text, the
    name cut at 80 cells."""
    def title(gpu: GpuReading, host: str | None = "node-1", target: str | None = EXPORTER
              ) -> str:
        [(text, role)] = pane_lines([GpuView(gpu, host, target)])[0]
        assert role == "title"
        return text

    gpu = GpuReading(3, "NVIDIA L40S", "GPU-77", None, None, None, None, None)
    assert title(gpu, target=None) == "GPU3 NVIDIA L40S"
    assert title(gpu) == "node-1 GPU3 NVIDIA L40S"
    assert title(gpu, host=None) == "? GPU3 NVIDIA L40S"
    unnumbered = GpuReading(None, "A\x1b[2J" + "x" * 100, "u", None, None, None, None, None,
                            mig_instance="2", mig_profile="")
    assert title(unnumbered, host="h\x9b") == f"h\\x9b GPU? A\\x1b[2J{'x' * 71}… MIG 2"


def test_a_local_gpus_lines() -> None:
    """Memory as a bar of eighths and GiB, use, temperature and power (a dash for what the
    reader does not give); each process with its memory, the server it belongs to and vLLM's
    mark; a GPU without processes says so."""
    busy, idle = sample_gpus()
    owner = Owner("http://127.0.0.1:8000/metrics", "vllm-a", "process")
    views = [GpuView(busy, "host", None, (owner,), {4242: owner}), GpuView(idle, "host", None)]
    assert pane_lines(views) == [
        [("GPU0 NVIDIA H100 80GB HBM3", "title")],
        [(" mem ███████▍ 74.0/80.0 GiB", "")],
        [(" util 91%  63°C  512W", "")],
        [("    4242  73.0G ", ""), ("vllm-a ", "owner"), ("vLLM ", "vllm"),
         ("python3 -m vllm.entrypoints.openai.api_server", "vllm")],
        [("    5151      – ", ""), ("python3 train.py", "")],
        [],
        [("GPU1 NVIDIA H100 80GB HBM3", "title")],
        [(" mem ░░░░░░░░ 0.0/80.0 GiB", "")],
        [(" util 0%  31°C  –", "")],
        [(" no processes", "dim")],
    ]


def test_an_exporters_gpu_lines() -> None:
    """nvidia_gpu_exporter's processes with their memory and names (none is vLLM); an
    exporter's GPU without processes says nothing of them (it may not report them)."""
    [h100] = read_exposition(gpu_fixture(NVIDIA_SMI_H100)).gpus
    t4, unread = read_exposition(gpu_fixture(DCGM_T4)).gpus
    views = [GpuView(h100, "gpu-1", EXPORTER), GpuView(t4, None, EXPORTER),
             GpuView(unread, "551bdf382151", EXPORTER)]
    assert pane_lines(views) == [
        [("gpu-1 GPU0 NVIDIA H100 80GB HBM3", "title")],
        [(" mem ██░░░░░░ 19.4/79.6 GiB", "")],
        [(" util 100%  59°C  632W", "")],
        [("   11327   2.5G ", ""), ("/root/tools/memhog", "")],
        [("   11328   1.5G ", ""), ("/root/tools/memhog", "")],
        [("   11345  15.3G ", ""), ("./gpu_burn", "")],
        [],
        [("? GPU0 Tesla T4", "title")],
        [(" mem ░░░░░░░░ 0.0/14.8 GiB", "")],
        [(" util 0%  25°C  9W", "")],
        [],
        [("551bdf382151 GPU0 Tesla T4", "title")],
        [(" mem ········ –/14.8 GiB", "")],
        [(" util –  –  –", "")],
    ]


def test_an_exporters_gpu_serves_the_servers_of_its_pod_or_host() -> None:
    """Owners by pod or by host are named on a line of their own ("serves"), each through
    the display boundary; the pods dcgm names follow, without the parts it leaves out."""
    in_pod = prometheus_state("10.0.0.5:8000", VLLM, pod="bar", namespace="foo")
    [view] = gpu_views([], {}, [in_pod, server_state("10.0.0.5:9400", gpu_fixture(DCGM_POD))])
    assert pane_lines([view])[3:] == [
        [(" serves ", "dim"), ("10.0.0.5:8000", "owner"), (" (same pod)", "dim")],
        [(" pod foo/bar/baz", "dim")],
    ]
    on_host = [server_state("gpu-1:8000", VLLM, name="a\x1b[2J"),
               server_state("gpu-1:8001", VLLM), server_state("gpu-1:9400",
                                                              gpu_fixture(DCGM_T4))]
    view = gpu_views([], {}, on_host)[0]
    assert pane_lines([view])[3:] == [
        [(" serves ", "dim"), ("a\\x1b[2J, gpu-1:8001", "owner"), (" (same host)", "dim")]]
    [gpu] = read_exposition(gpu_fixture(DCGM_POD)).gpus
    bare = dataclasses.replace(gpu, workloads=(Workload(None, "p", None),))
    assert pane_lines([GpuView(bare, None, EXPORTER)])[3:] == [[(" pod p", "dim")]]


def _rising(trails: GpuTrails, gpu: GpuReading) -> None:
    """0, 20, 40, 60 and 80 GiB of 80 at 930 s, 950 s, ..., 990 s and 1000 s."""
    for t, used in ((930.0, 0), (950.0, 20), (970.0, 40), (990.0, 60), (1000.0, 80)):
        trails.record(t, [GpuView(dataclasses.replace(gpu, memory_used_bytes=used * GIB),
                                  None, None)])


def sparks(lines: list[list[tuple[str, str]]]) -> list[list[tuple[str, str]]]:
    return [line for line in lines if any(role == "spark" for _, role in line)]


def test_a_gpus_memory_history_over_the_panes_width() -> None:
    """From 0 to the GPU's total over the last span, one cell per column on the wall clock:
    drawn only where at least 8 cells fit beside the bar (the pane's width less 9)."""
    gpu = sample_gpus()[0]
    trails = GpuTrails(span_s=80.0)
    _rising(trails, gpu)
    view = GpuView(gpu, "host", None)

    def history(cells: int, now: float = 1000.0) -> list[list[tuple[str, str]]]:
        return sparks(pane_lines([view], trails=trails, now=now, cells=cells))

    assert history(17) == [[(" ", ""), ("▁ ▂ ▄ ▆█", "spark"), (" 1m", "dim")]]
    assert history(16) == []
    assert history(25) == [[(" ", ""), (" ▁   ▂   ▄   ▆ █", "spark"), (" 1m", "dim")]]
    assert history(17, now=1010.0) == [[(" ", ""), (" ▂ ▄ ▆█ ", "spark"), (" 1m", "dim")]]
    assert pane_lines([view], cells=17) == pane_lines([view])  # no trails
    unknown_total = GpuView(dataclasses.replace(gpu, memory_total_bytes=None), "host", None)
    assert sparks(pane_lines([unknown_total], trails=trails, now=1000.0, cells=40)) == []
    other = GpuView(sample_gpus()[1], "host", None)  # no history of its own
    assert sparks(pane_lines([other], trails=trails, now=1000.0, cells=40)) == []


def test_a_gpus_history_is_drawn_as_of_0_unless_now_is_given() -> None:
    """A clock that starts at 0 (the history's time is the caller's): one column a second
    over 8 s, the point at 0 in the last column as of 0, one column back as of 1."""
    gpu = sample_gpus()[0]
    trails = GpuTrails(span_s=8.0)
    trails.record(0.0, [GpuView(gpu, None, None)])
    view = GpuView(gpu, None, None)
    assert sparks(pane_lines([view], trails=trails, cells=17)) == [
        [(" ", ""), ("       ▇", "spark"), (" 8s", "dim")]]
    assert sparks(pane_lines([view], trails=trails, now=1.0, cells=17)) == [
        [(" ", ""), ("      ▇ ", "spark"), (" 8s", "dim")]]


def test_a_gpus_history_keeps_the_span_exactly() -> None:
    """A point exactly the span old is kept, older ones go; a GPU last seen exactly the span
    ago is kept, a hair longer and it is forgotten."""
    gpu = sample_gpus()[0]
    trails = GpuTrails(span_s=10.0)
    trails.record(100.0, [GpuView(gpu, None, None)])
    trails.record(105.0, [GpuView(gpu, None, None)])
    trails.record(110.0, [GpuView(gpu, None, None)])
    assert list(trails.of(gpu)) == [(100.0, 74 * GIB), (105.0, 74 * GIB), (110.0, 74 * GIB)]
    trails.record(110.5, [GpuView(gpu, None, None)])
    assert list(trails.of(gpu)) == [(105.0, 74 * GIB), (110.0, 74 * GIB), (110.5, 74 * GIB)]
    trails.record(120.5, [])  # not seen: its history as it was
    assert list(trails.of(gpu)) == [(105.0, 74 * GIB), (110.0, 74 * GIB), (110.5, 74 * GIB)]
    trails.record(120.6, [])
    assert list(trails.of(gpu)) == [] and len(trails) == 0


def test_gpu_trails_forget_gpus_gone_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exporter naming 1,000 new GPUs a scrape grew the app's history without end."""
    monkeypatch.setattr(gpus_view, "MAX_TRAILS", 300)
    trails = GpuTrails(span_s=10.0)
    def gpu(i: int, uuid: str) -> GpuReading:
        return GpuReading(i, "GPU", uuid, 1, 2, None, None, None)

    for t in range(5):
        trails.record(float(t), [GpuView(gpu(i, f"{t}-{i}"), "h", "x") for i in range(1000)])
        assert len(trails) == 300
    assert list(trails.of(gpu(999, "4-999"))) == [(4.0, 1)]
    assert list(trails.of(gpu(699, "4-699"))) == []  # the least recent went first
    trails.record(100.0, [])
    assert len(trails) == 0


def test_gpu_trails_hold_four_exporters_at_their_cap() -> None:
    """4 x 256 GPUs all have a history; one GPU more and the one seen longest ago goes."""
    gpus = [GpuReading(i % 8, "GPU", f"GPU-{i}", i, 8, None, None, None)
            for i in range(4 * MAX_GPUS_PER_EXPORTER + 1)]
    trails = GpuTrails(span_s=10.0)
    trails.record(0.0, [GpuView(g, None, None) for g in gpus[:-1]])
    assert len(trails) == 1024
    trails.record(1.0, [GpuView(gpus[-1], None, None)])
    assert len(trails) == 1024
    assert (list(trails.of(gpus[0])), list(trails.of(gpus[1])), list(trails.of(gpus[-1]))) == (
        [], [(0.0, 1)], [(1.0, 1024)])


def test_gpu_trails_keep_the_most_recently_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the cap nothing goes; past it, the GPU seen longest ago goes (a GPU seen again
    is recent again, with its history); GPUs gone for the span go first and leave no more
    than the cap (they were counted twice: 3 GPUs kept of a cap of 2)."""
    monkeypatch.setattr(gpus_view, "MAX_TRAILS", 2)
    a, b, c, d, e = (GpuReading(i, "GPU", f"GPU-{i}", i, 8, None, None, None)
                     for i in range(5))
    trails = GpuTrails(span_s=10.0)
    trails.record(0.0, [GpuView(a, None, None), GpuView(b, None, None)])
    assert len(trails) == 2
    trails.record(1.0, [GpuView(a, None, None)])
    trails.record(2.0, [GpuView(c, None, None)])
    assert [list(trails.of(g)) for g in (a, b, c)] == [[(0.0, 0), (1.0, 0)], [], [(2.0, 2)]]
    trails.record(20.0, [GpuView(g, None, None) for g in (c, d, e)])
    assert [list(trails.of(g)) for g in (a, c, d, e)] == [[], [], [(20.0, 3)], [(20.0, 4)]]


def test_the_headers_gpu_note() -> None:
    """Nothing when every source was read; NVML's absence (its reason only while no GPU is
    known at all) and how many exporters fail, short and with the reason, the reason cut to
    40 cells exactly."""
    dcgm = GpuSource("dcgm", EXPORTER, "10.0.0.5", "failed", "timeout", 0)
    assert gpu_note(None, [], True) is None
    assert gpu_note(None, [], False) is None
    assert gpu_note("NVML init failed: Driver Not Loaded", [], False) == (
        "no NVML", "NVML: Driver Not Loaded")
    assert gpu_note("NVML init failed: Driver Not Loaded", [], True) == ("no NVML", "no NVML")
    assert gpu_note(None, [dcgm], True) == ("1 exporter failing", "1 exporter failing")
    assert gpu_note("x", [dcgm, dcgm], True) == ("no NVML; 2 exporters failing",
                                                 "no NVML; 2 exporters failing")
    at_limit = "r" * 34  # "NVML: " and 34 characters: 40
    assert gpu_note(at_limit, [], False) == ("no NVML", f"NVML: {at_limit}")
    assert gpu_note(at_limit + "s", [], False) == ("no NVML", f"NVML: {'r' * 33}…")
    assert gpu_note("a\x1b[2J", [dcgm], False) == ("no NVML; 1 exporter failing",
                                                   "NVML: a\\x1b[2J; 1 exporter failing")


def test_failed_sources_are_those_that_could_not_be_read() -> None:
    read = GpuSource("dcgm", EXPORTER, "10.0.0.5", "ok", None, 2)
    broken = GpuSource("dcgm", "http://b:9400/metrics", "b", "failed", "down", 0)
    absent = nvml_source(0, "NVML Shared Library Not Found")
    assert failed_sources([read, broken, absent, broken]) == [broken, broken]
    assert failed_sources([]) == []
