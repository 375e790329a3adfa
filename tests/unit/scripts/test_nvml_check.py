"""The GPU-machine check script's comparison (run for real only where a GPU is lent)."""

from __future__ import annotations

import importlib.util
import sys

from kvtop.collect.nvml import GpuProcess, GpuReading
from tests.support.paths import REPO

spec = importlib.util.spec_from_file_location("nvml_check", REPO / "scripts" / "nvml_check.py")
assert spec is not None and spec.loader is not None
nvml_check = importlib.util.module_from_spec(spec)
sys.modules["nvml_check"] = nvml_check
spec.loader.exec_module(nvml_check)

MIB = 2**20


def reading(used_mib: int = 1000, pids: tuple[int, ...] = (42,)) -> GpuReading:
    return GpuReading(0, "NVIDIA H200", "GPU-1", used_mib * MIB, 143771 * MIB, 10.0, 40.0,
                      120.0, tuple(GpuProcess(p, "vllm serve", 500 * MIB, True) for p in pids))


def smi(used_mib: int = 1010, pids: frozenset[int] = frozenset({42})) -> object:
    return nvml_check.SmiGpu(0, "NVIDIA H200", "GPU-1", used_mib, 143771, pids)


def test_agreeing_readings_have_no_problems() -> None:
    assert nvml_check.compare([reading()], [smi()]) == []


def test_disagreements_are_named() -> None:
    problems = nvml_check.compare([reading(used_mib=5000, pids=())], [smi(), smi()])
    text = " | ".join(problems)
    assert "kvtop sees 1 GPUs, nvidia-smi 2" in text
    assert "used 5000 MiB vs 1010 MiB" in text
    assert "processes [] vs [42]" in text


def test_owners_agreeing_with_nvidia_smi() -> None:
    expected = {100: "check", 101: "check", 300: "vllm"}
    assert nvml_check.compare_owners(dict(expected), {100, 101, 300, 555}, expected) == []


def test_owner_disagreements_are_named() -> None:
    expected = {100: "check", 101: "check"}
    problems = nvml_check.compare_owners({100: "check", 555: "check"}, {100, 555}, expected)
    text = " | ".join(problems)
    assert "nvidia-smi does not list pid 101 (check)" in text  # no CUDA context there
    assert "pid 555: kvtop says 'check', it is none of the servers'" in text
    problems = nvml_check.compare_owners({}, {100, 101}, expected)
    assert problems == ["pid 100: kvtop says None, the owner is 'check'",
                        "pid 101: kvtop says None, the owner is 'check'"]
