"""Real GPU exporter bodies kept in the repository (tests/fixtures/gpu, INDEX.md says where
each came from)."""

from __future__ import annotations

from pathlib import Path

GPU_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu"
DCGM_T4 = "dcgm-datadog-t4.txt"  # dcgm-exporter 2.x, one T4 (+ Datadog's additions)
DCGM_POD = "dcgm-datadog-pod-labels.txt"  # one sample with pod/namespace/container labels
DCGM_MIG = "dcgm-nvidia-docs-a100-mig.txt"  # an A100 and its MIG instance 13 (1g.5gb)
NVIDIA_SMI_H100 = "nvidia_gpu_exporter-h100-load.metrics"  # nvidia_gpu_exporter 1.4+


def gpu_fixture(name: str) -> str:
    return (GPU_FIXTURES / name).read_text(encoding="utf-8")
