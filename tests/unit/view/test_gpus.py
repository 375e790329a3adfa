"""The GPU views' model without a terminal: one time axis for the KV and GPU memory lines
(the flat-line-vs-filling contrast), the GPU column's cell, what the pane says when a
source has nothing."""

from __future__ import annotations

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.gpu import GpuReading
from kvtop.derive.gpu_owners import GpuView, nvml_source
from kvtop.derive.stats import EngineStats
from kvtop.view import format as fmt
from kvtop.view import gpus as gpus_view
from kvtop.view.chart import bins, spark_rows
from kvtop.view.gpus import GpuTrails, memory_points, memory_top, owned_cell, pane_lines
from tests.scenarios.gpu import DCGM_MIG, gpu_fixture

GIB = 2**30
NOW, SPAN, CELLS = 10_000.0, 300.0, 30


def test_kv_and_gpu_lines_share_one_time_axis() -> None:
    # vLLM takes its pool up front: nvidia-smi stays at 74 GiB while the pool fills
    times = [NOW - SPAN + 10 * i for i in range(30)]
    kv = [EngineStats("m", "0", t, blocks_total=1000, blocks_used=30.0 * i)
          for i, t in enumerate(times)]
    gpu = [(t, 74 * GIB, 80 * GIB) for t in times]
    kv_cells = bins([(s.t, s.blocks_used) for s in kv], NOW, SPAN, CELLS)
    gpu_cells = memory_points(gpu, NOW, SPAN, CELLS)
    assert [v is None for v in kv_cells] == [v is None for v in gpu_cells]  # same cells
    [kv_line] = spark_rows(kv_cells, 1000, 1)
    [gpu_line] = spark_rows(gpu_cells, memory_top(gpu, (74 * GIB, 80 * GIB)), 1)
    assert kv_line.strip()[0] in "▁▂" and kv_line.strip()[-1] == "▇"  # filling
    assert set(gpu_line.strip()) == {"▇"}  # a flat line


def test_gpu_column_cell() -> None:
    assert owned_cell(None).text == fmt.DASH and owned_cell(None).level == "dim"
    assert owned_cell((None, 80 * GIB)).text == fmt.DASH  # use unknown: not 0
    assert owned_cell((74 * GIB, 80 * GIB)).text == "74/80G"
    assert owned_cell((74 * GIB, None)).text == "74G"


def test_pane_says_why_it_is_empty() -> None:
    assert pane_lines([], None) == [[("no GPU found", "dim")]]
    lines = pane_lines([], "NVML Shared Library Not Found")
    assert lines == [[("NVML unavailable: NVML Shared Library Not Found", "bad")]]


def test_pane_mig_instance_title() -> None:
    whole, instance = read_exposition(gpu_fixture(DCGM_MIG)).gpus
    views = [GpuView(gpu, gpu.host, "http://10.1.1.1:9400/metrics") for gpu in (whole, instance)]
    titles = [line[0][0] for line in pane_lines(views, None) if line and line[0][1] == "title"]
    assert titles == ["ub20-a100-k8s GPU0 GPU", "ub20-a100-k8s GPU0 GPU MIG 13 1g.5gb"]


def test_nvml_source_tells_absent_from_broken() -> None:
    assert nvml_source(0, "NVML Shared Library Not Found").status == "unavailable"
    assert nvml_source(0, "NVMLError_Unknown: boom", failed=True).status == "failed"
    assert nvml_source(2).status == "ok" and nvml_source(2).error is None


def test_gpu_trails_forget_gpus_gone_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exporter naming 1,000 new GPUs a scrape grew the app's history without end."""
    monkeypatch.setattr(gpus_view, "MAX_TRAILS", 300)
    trails = GpuTrails(span_s=10.0)
    def gpu(i: int, uuid: str) -> GpuReading:
        return GpuReading(i, "GPU", uuid, 1, 2, None, None, None)

    for t in range(5):
        trails.record(float(t), [GpuView(gpu(i, f"{t}-{i}"), "h", "x") for i in range(1000)])
        assert len(trails) <= 300
    assert list(trails.of(gpu(999, "4-999"))) == [(4.0, 1)]
    trails.record(100.0, [])
    assert len(trails) == 0
