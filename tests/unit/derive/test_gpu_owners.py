"""Remote ownership from real bodies folded by the real tracker: a GPU exporter's GPUs belong
to the servers on its host (its address, or dcgm's Hostname label), or to the server in the
pod dcgm-exporter names; what a server's GPUs use sums over them, never twice.

Which server owns which GPU, as the snapshot's ``gpus`` and ``gpu_sources`` say it and as
the engine pane sums it: local GPUs through the process listening on a server's port (this
test process listens), exporters' GPUs by pod or host, every place GPUs were looked for with
what came of it, and the GPU memory history."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtop.collect.gpu import MIB, GpuProcess, GpuReading
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive import gpu_owners
from kvtop.derive.gpu_owners import (
    GpuMemoryHistory,
    gpu_views,
    local_host,
    local_ports,
    owned_memory,
    target_host,
    view_json,
)
from kvtop.derive.tracker import TargetTracker
from kvtop.report.gpus import gpu_report
from tests.fakes.fake_nvml import GIB, FakeGpuReader
from tests.scenarios.gpu import (
    DCGM_MIG,
    DCGM_POD,
    DCGM_T4,
    NVIDIA_SMI_H100,
    gpu_fixture,
    prometheus_state,
)
from tests.scenarios.gpu import server_state as state
from tests.support.paths import fixture_text


def owners_of(views, index: int = 0) -> list[tuple[str, str]]:
    return [(o.label, o.by) for o in views[index].owners]


def test_an_exporter_s_gpus_belong_to_the_servers_on_its_host() -> None:
    states = [state("gpu-1:8000", VLLM), state("gpu-2:8000", VLLM),
              state("gpu-1:9400", gpu_fixture(DCGM_T4))]
    views = gpu_views([], {}, states)
    assert len(views) == 2 and all(v.target == "http://gpu-1:9400/metrics" for v in views)
    assert owners_of(views) == [("gpu-1:8000", "host")]  # not gpu-2's server
    # the exporter ran in a container: Hostname is its id, the exporter's address decides
    assert views[0].host == "424773df46e0"


def test_dcgm_hostname_label_matches_the_server_s_host() -> None:
    states = [state("ub20-a100-k8s.cluster.local:8000", VLLM, name="a100"),
              state("10.1.1.1:9400", gpu_fixture(DCGM_MIG))]
    whole, instance = gpu_views([], {}, states)
    assert owners_of([whole]) == owners_of([instance]) == [("a100", "host")]


def test_the_pod_dcgm_names_beats_the_host() -> None:
    in_pod = prometheus_state("10.0.0.5:8000", VLLM, pod="bar", namespace="foo")
    other = prometheus_state("10.0.0.5:8001", VLLM, pod="qux", namespace="foo")
    exporter = state("10.0.0.5:9400", gpu_fixture(DCGM_POD))
    (view,) = gpu_views([], {}, [in_pod, other, exporter])
    assert owners_of([view]) == [("10.0.0.5:8000", "pod")]
    elsewhere = prometheus_state("10.0.0.5:8000", VLLM, pod="bar",
                                 namespace="prod")
    (view,) = gpu_views([], {}, [elsewhere, exporter])  # same pod name, other namespace
    assert owners_of([view]) == [("10.0.0.5:8000", "host")]


def test_what_a_server_s_gpus_use() -> None:
    server = state("gpu-1:8000", VLLM)
    t4 = gpu_views([], {}, [server, state("gpu-1:9400", gpu_fixture(DCGM_T4))])
    # one T4 says 0 MiB used, the other says nothing: the sum is unknown, not 0
    assert owned_memory(t4) == {server.target.url: (None, 2 * 15109 * MIB)}
    mig = gpu_views([], {}, [server, state("gpu-1:9400", gpu_fixture(DCGM_MIG))])
    # the MIG instance is a slice of the A100 already counted: not added again
    assert owned_memory(mig) == {server.target.url: (4845 * MIB, (4845 + 35690) * MIB)}
    smi = gpu_views([], {}, [server, state("gpu-1:9835", gpu_fixture(NVIDIA_SMI_H100))])
    assert owned_memory(smi) == {server.target.url: (20780679168, 85520809984)}


def test_snapshot_entry_of_an_exporter_gpu() -> None:
    server = state("gpu-1:8000", VLLM)
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
    tracker.update(read_scrape(Scrape(target, 1.0, gpu_fixture(DCGM_T4))))
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


VLLM = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")


def local_gpu(*pids: int) -> GpuReading:
    return GpuReading(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-aaaa",
                      memory_used_bytes=70 * GIB, memory_total_bytes=80 * GIB,
                      util_percent=93.0, temperature_c=61.0, power_w=412.0,
                      processes=tuple(GpuProcess(pid, f"proc {pid}", GIB, False)
                                      for pid in pids))


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_a_local_gpu_process_belongs_to_the_server_listening_on_its_port(
        listening_port: int) -> None:
    server = state(f"127.0.0.1:{listening_port}", VLLM, name="local-vllm")
    url = server.target.url
    reader = FakeGpuReader([local_gpu(os.getpid(), 999_999_999)])
    gpus, sources = gpu_report([server], reader=reader)
    (gpu,) = gpus
    owner = {"target": url, "label": "local-vllm", "by": "process"}
    assert (gpu["uuid"], gpu["host"], gpu["target"]) == ("GPU-aaaa", local_host(), None)
    assert gpu["owners"] == [owner]
    assert [(p["pid"], p["owner"]) for p in gpu["processes"]] == [
        (os.getpid(), owner), (999_999_999, None)]
    assert sources == [{"source": "nvml", "target": None, "host": local_host(),
                        "status": "ok", "error": None, "gpus": 1}]


def test_a_process_under_a_server_kvtop_could_not_identify_is_named_by_its_url(
        listening_port: int) -> None:
    other = state(f"127.0.0.1:{listening_port}", "# TYPE node_load1 gauge\nnode_load1 0.5\n")
    assert other.kind == "unknown"
    url = other.target.url
    (view,) = gpu_views([local_gpu(os.getpid())], {os.getpid(): url}, [other])
    assert [(o.url, o.label, o.by) for o in view.owners] == [(url, url, "process")]


def test_nvml_absent_or_broken_is_said_in_the_sources() -> None:
    _, sources = gpu_report([], reader=FakeGpuReader(unavailable="NVML Shared Library Not Found"))
    assert sources == [{"source": "nvml", "target": None, "host": local_host(),
                        "status": "unavailable", "error": "NVML Shared Library Not Found",
                        "gpus": 0}]

    class Broken:
        def read(self) -> list[GpuReading]:
            raise RuntimeError("driver/library version mismatch")

    _, sources = gpu_report([], reader=Broken())
    assert [(s["status"], s["error"]) for s in sources] == [
        ("failed", "RuntimeError: driver/library version mismatch")]
    assert gpu_report([], with_nvml=False) == ([], [])


def test_every_exporter_is_a_source_read_or_not() -> None:
    vllm = state("gpu-1:8000", VLLM)
    dcgm = state("gpu-1:9400", gpu_fixture(DCGM_T4))
    down = Target.from_spec("gpu-2:9835")
    tracker = TargetTracker(down, stale_after_s=0)
    exporter = gpu_fixture("nvidia_gpu_exporter-h100-load.metrics")
    tracker.update(read_scrape(Scrape(down, 1.0, exporter)))
    failed = tracker.update(Scrape(down, 2.0, failure="down", error="connection refused"))
    gpus, sources = gpu_report([vllm, dcgm, failed], with_nvml=False)
    assert len(gpus) == 2 and failed.error is not None and "connection refused" in failed.error
    assert sources == [
        {"source": "dcgm", "target": "http://gpu-1:9400/metrics", "host": "gpu-1",
         "status": "ok", "error": None, "gpus": 2},
        {"source": "nvidia_gpu_exporter", "target": "http://gpu-2:9835/metrics",
         "host": "gpu-2", "status": "failed", "error": failed.error, "gpus": 0}]


def test_a_server_listed_after_an_exporter_still_owns_its_gpus() -> None:
    states = [state("gpu-1:9400", gpu_fixture(DCGM_T4)), state("gpu-1:8000", VLLM)]
    views = gpu_views([], {}, states)
    assert [[(o.url, o.by) for o in v.owners] for v in views] == [
        [("http://gpu-1:8000/metrics", "host")]] * 2


def test_a_prometheus_target_on_this_machine_is_not_a_local_server() -> None:
    local = Target.from_spec("127.0.0.1:8000")
    through_prometheus = Target("http://127.0.0.1:9090#vllm/127.0.0.1:8001")
    assert local_ports([local, through_prometheus]) == {8000: local.url}


def dcgm_line(field: str, value: float, gpu: str, host: str, instance: str | None = None,
              pod: str | None = None) -> str:
    labels = f'gpu="{gpu}",UUID="GPU-{host}-{gpu}",Hostname="{host}"'
    if instance is not None:
        labels += f',GPU_I_PROFILE="3g.20gb",GPU_I_ID="{instance}"'
    if pod is not None:
        labels += f',namespace="prod",pod="{pod}",container="vllm"'
    return f"DCGM_FI_{field}{{{labels}}} {value}\n"


def mig_gpu(gpu: str, host: str, pod: str) -> str:
    """A whole A100 (no pod on its rows) and one MIG instance a pod uses."""
    return "".join([
        dcgm_line("DEV_FB_USED", 1000, gpu, host), dcgm_line("DEV_FB_FREE", 39000, gpu, host),
        dcgm_line("DEV_FB_USED", 300, gpu, host, "1", pod),
        dcgm_line("DEV_FB_FREE", 19700, gpu, host, "1", pod),
    ])


def test_a_mig_instance_counts_for_a_server_unless_it_counts_the_whole_gpu() -> None:
    # A (the node's own address, hostNetwork) and B (the pod's address) serve in pod "p";
    # GPU 0 is on A's node: A counts the whole GPU, B its instance. GPU 1 is on a node
    # with no server: nobody counts it whole, so both count its instance.
    a = prometheus_state("node-a:8000", VLLM, pod="p", namespace="prod")
    b = prometheus_state("10.0.0.5:8001", VLLM, pod="p", namespace="prod")
    exporter = state("10.0.0.9:9400", mig_gpu("0", "node-a", "p") + mig_gpu("1", "node-b", "p"))
    views = gpu_views([], {}, [a, b, exporter])
    assert [(v.gpu.index, v.gpu.mig_instance, [o.url for o in v.owners]) for v in views] == [
        (0, None, [a.target.url]), (0, "1", [a.target.url, b.target.url]),
        (1, None, []), (1, "1", [a.target.url, b.target.url])]
    whole, instance = (1000 * MIB, 40000 * MIB), (300 * MIB, 20000 * MIB)
    assert owned_memory(views) == {
        a.target.url: (whole[0] + instance[0], whole[1] + instance[1]),
        b.target.url: (2 * instance[0], 2 * instance[1])}


def test_a_pod_is_matched_with_or_without_a_namespace_and_a_server_without_one_by_host(
        ) -> None:
    in_pod = prometheus_state("10.0.0.5:8000", "vllm:num_requests_running"
                            '{model_name="m"} 1\n', pod="bar")  # one series, no namespace
    plain = prometheus_state("10.0.0.9:8001", VLLM)  # no pod label: only its host can match
    exporter = state("10.0.0.9:9400", gpu_fixture("dcgm-datadog-pod-labels.txt"))
    (view,) = gpu_views([], {}, [in_pod, plain, exporter])
    assert [(o.url, o.by) for o in view.owners] == [(in_pod.target.url, "pod")]
    (view,) = gpu_views([], {}, [plain, exporter])
    assert [(o.url, o.by) for o in view.owners] == [(plain.target.url, "host")]


def test_gpu_memory_history_keeps_its_span_per_server() -> None:
    history = GpuMemoryHistory(span_s=10.0)
    for t in range(13):
        history.record(float(t), {"a": (t * GIB, 80 * GIB), "b": (None, None)})
    assert [point[0] for point in history.series("a")] == [float(t) for t in range(2, 13)]
    assert history.series("a")[-1] == (12.0, 12 * GIB, 80 * GIB)
    assert history.series("b")[0] == (2.0, None, None)
    assert list(history.series("never recorded")) == []


def test_gpu_memory_history_forgets_servers_gone_and_is_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_owners, "MAX_HISTORIES", 50)
    history = GpuMemoryHistory(span_s=10.0)
    history.record(0.0, {"gone": (1, 2)})
    for t in range(1, 40):  # 100 new servers a record (churning pods)
        history.record(float(t), {f"s{t}-{i}": (1, 2) for i in range(100)})
    assert len(history) == 50 and list(history.series("gone")) == []
    assert history.series("s39-99") and not history.series("s38-0")  # the newest kept
    history.record(100.0, {"last": (1, 2)})
    assert len(history) == 1  # the others not seen for the span
