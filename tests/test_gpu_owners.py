"""Remote ownership from real bodies folded by the real tracker: a GPU exporter's GPUs belong
to the servers on its host (its address, or dcgm's Hostname label), or to the server in the
pod dcgm-exporter names; what a server's GPUs use sums over them, never twice."""

from __future__ import annotations

import pytest

from kvtop.collect.gpu import MIB
from kvtop.collect.target import Scrape, Target
from kvtop.derive.gpu_owners import gpu_views, owned_memory, target_host, view_json
from kvtop.derive.tracker import TargetTracker
from tests.gpu_fixtures import (
    DCGM_MIG,
    DCGM_POD,
    DCGM_T4,
    NVIDIA_SMI_H100,
    gpu_fixture,
    prometheus_state,
)
from tests.gpu_fixtures import server_state as state
from tests.paths import fixture_text

VLLM = "vllm-0.33.0-v1-twin-under-load.txt"


def owners_of(views, index: int = 0) -> list[tuple[str, str]]:
    return [(o.label, o.by) for o in views[index].owners]


def test_an_exporter_s_gpus_belong_to_the_servers_on_its_host() -> None:
    states = [state("gpu-1:8000", fixture_text(VLLM)), state("gpu-2:8000", fixture_text(VLLM)),
              state("gpu-1:9400", gpu_fixture(DCGM_T4))]
    views = gpu_views([], {}, states)
    assert len(views) == 2 and all(v.target == "http://gpu-1:9400/metrics" for v in views)
    assert owners_of(views) == [("gpu-1:8000", "host")]  # not gpu-2's server
    # the exporter ran in a container: Hostname is its id, the exporter's address decides
    assert views[0].host == "424773df46e0"


def test_dcgm_hostname_label_matches_the_server_s_host() -> None:
    states = [state("ub20-a100-k8s.cluster.local:8000", fixture_text(VLLM), name="a100"),
              state("10.1.1.1:9400", gpu_fixture(DCGM_MIG))]
    whole, instance = gpu_views([], {}, states)
    assert owners_of([whole]) == owners_of([instance]) == [("a100", "host")]


def test_the_pod_dcgm_names_beats_the_host() -> None:
    in_pod = prometheus_state("10.0.0.5:8000", fixture_text(VLLM), pod="bar", namespace="foo")
    other = prometheus_state("10.0.0.5:8001", fixture_text(VLLM), pod="qux", namespace="foo")
    exporter = state("10.0.0.5:9400", gpu_fixture(DCGM_POD))
    (view,) = gpu_views([], {}, [in_pod, other, exporter])
    assert owners_of([view]) == [("10.0.0.5:8000", "pod")]
    elsewhere = prometheus_state("10.0.0.5:8000", fixture_text(VLLM), pod="bar",
                                 namespace="prod")
    (view,) = gpu_views([], {}, [elsewhere, exporter])  # same pod name, other namespace
    assert owners_of([view]) == [("10.0.0.5:8000", "host")]


def test_what_a_server_s_gpus_use() -> None:
    server = state("gpu-1:8000", fixture_text(VLLM))
    t4 = gpu_views([], {}, [server, state("gpu-1:9400", gpu_fixture(DCGM_T4))])
    # one T4 says 0 MiB used, the other says nothing: the sum is unknown, not 0
    assert owned_memory(t4) == {server.target.url: (None, 2 * 15109 * MIB)}
    mig = gpu_views([], {}, [server, state("gpu-1:9400", gpu_fixture(DCGM_MIG))])
    # the MIG instance is a slice of the A100 already counted: not added again
    assert owned_memory(mig) == {server.target.url: (4845 * MIB, (4845 + 35690) * MIB)}
    smi = gpu_views([], {}, [server, state("gpu-1:9835", gpu_fixture(NVIDIA_SMI_H100))])
    assert owned_memory(smi) == {server.target.url: (20780679168, 85520809984)}


def test_snapshot_entry_of_an_exporter_gpu() -> None:
    server = state("gpu-1:8000", fixture_text(VLLM))
    (view,) = gpu_views([], {}, [server, state("gpu-1:9835", gpu_fixture(NVIDIA_SMI_H100))])
    entry = view_json(view)
    assert entry["source"] == "nvidia_gpu_exporter" and entry["host"] == "gpu-1"
    assert entry["target"] == "http://gpu-1:9835/metrics"
    assert entry["owners"] == [{"target": server.target.url, "label": "gpu-1:8000",
                                "by": "host"}]
    assert entry["mig"] is None and entry["kubernetes"] == []
    # remote pids are not this machine's: no process is said to be a server's
    assert [p["owner"] for p in entry["processes"]] == [None, None, None]


def test_a_down_exporter_keeps_no_gpus() -> None:
    target = Target.from_spec("gpu-1:9400")
    tracker = TargetTracker(target, stale_after_s=0)
    tracker.update(Scrape(target, 1.0, gpu_fixture(DCGM_T4)))
    tracker.update(Scrape(target, 2.0, failure="down", error="connection refused"))
    assert tracker.state.kind == "dcgm" and tracker.state.gpus == []
    assert gpu_views([], {}, [tracker.state]) == []


def test_what_is_not_an_inference_server_owns_nothing() -> None:
    states = [state("gpu-1:9100", "# TYPE node_load1 gauge\nnode_load1 0.5\n"),
              state("gpu-1:9400", gpu_fixture(DCGM_T4))]
    assert states[0].kind == "unknown"
    assert all(view.owners == () for view in gpu_views([], {}, states))



@pytest.mark.parametrize(("instance", "host"), [
    ("[", "["), ("[evil]:80", "[evil]:80"), ("[::1", "[::1"), ("gpu-1:8000", "gpu-1"),
])
def test_a_hostile_instance_label_gives_a_host_never_an_error(instance: str, host: str) -> None:
    # urlsplit raises on a bracketed host that isn't an IP; that took the whole app down
    target = Target(url=f"http://prom:9090/api/v1#vllm/{instance}")
    assert target_host(target) == host
