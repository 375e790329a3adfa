"""The snapshot's GPUs when no reader is handed in: it reads this machine's NVML."""

from __future__ import annotations

import pytest

from kvtop.report import gpus
from tests.fakes.fake_nvml import FakeGpuReader


def test_without_a_reader_the_snapshot_reads_this_machines_nvml(
        monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeGpuReader()
    monkeypatch.setattr(gpus, "read_gpus", nvml.read)
    found, sources = gpus.gpu_report([])
    assert nvml.reads == 1 and len(found) == len(nvml.gpus) > 0
    assert [(s["source"], s["status"], s["gpus"]) for s in sources] == [
        ("nvml", "ok", len(nvml.gpus))]
