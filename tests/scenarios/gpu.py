"""Real GPU exporter bodies kept in the repository (tests/fixtures/gpu, INDEX.md says where
each came from), and servers' states to give them owners."""

from __future__ import annotations

from pathlib import Path

from kvtop.collect.exposition import parse
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetState, TargetTracker

GPU_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
DCGM_T4 = "dcgm-datadog-t4.txt"  # dcgm-exporter 2.x, one T4 (+ Datadog's additions)
DCGM_POD = "dcgm-datadog-pod-labels.txt"  # one sample with pod/namespace/container labels
DCGM_MIG = "dcgm-nvidia-docs-a100-mig.txt"  # an A100 and its MIG instance 13 (1g.5gb)
NVIDIA_SMI_H100 = "nvidia_gpu_exporter-h100-load.metrics"  # nvidia_gpu_exporter 1.4+


def gpu_fixture(name: str) -> str:
    return (GPU_FIXTURES / name).read_text(encoding="utf-8")


def server_state(spec: str, body: str, *, name: str | None = None) -> TargetState:
    """A server read once from its own /metrics."""
    target = Target.from_spec(spec, name=name)
    return TargetTracker(target).update(read_scrape(Scrape(target, 1.0, body)))


def prometheus_state(instance: str, body: str, **labels: str) -> TargetState:
    """A server as Prometheus hands it on: every series carries the target's labels (pod...)."""
    added = "".join(f'{k}="{v}",' for k, v in labels.items())
    target = Target(f"http://prom:9090#vllm/{instance}", name=instance, group="vllm")
    samples = parse(body.replace("{", "{" + added))
    return TargetTracker(target).update(read_scrape(Scrape(target, 1.0, samples=samples)))
