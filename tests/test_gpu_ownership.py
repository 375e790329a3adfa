"""Local ownership for real: a listening socket in this test process (the "API server"),
child and grandchild processes (vLLM's EngineCore and its workers are the API server's
descendants), fake NVML putting them on fake GPUs, and kvtop's /proc reading in between."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvtop.collect.nvml import NvmlReader
from kvtop.collect.ownership import PortOwners
from kvtop.collect.target import Target
from kvtop.derive.gpu_owners import gpu_views, local_ports
from kvtop.derive.tracker import TargetState
from tests.fakes.fake_nvml import GIB, FakeDevice, FakePynvml

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


@dataclass
class Server:
    """A listening socket held by this process, and processes below it."""

    port: int
    child: int  # EngineCore
    grandchild: int  # a tensor-parallel worker, child of the child


def _children(pid: int) -> list[int]:
    """pid's children, waited for (the shell starts its sleep a moment after spawning)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [int(p) for p in path.read_text().split()]
        if found:
            return found
        time.sleep(0.02)
    raise RuntimeError(f"process {pid} started no child")


@pytest.fixture
def server() -> Iterator[Server]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        # the child does not inherit the socket (Python opens it non-inheritable): only the
        # process tree links the workers to the port, as with vLLM's spawned EngineCore
        child = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
        try:
            yield Server(listener.getsockname()[1], child.pid, _children(child.pid)[0])
        finally:
            child.kill()
            child.wait()


def _targets(port: int) -> list[Target]:
    return [Target.from_spec(f"127.0.0.1:{port}"), Target.from_spec("10.9.9.9:8000")]


def test_port_to_process_tree(server: Server) -> None:
    ports = local_ports(_targets(server.port))
    url = f"http://127.0.0.1:{server.port}/metrics"
    assert ports == {server.port: url}  # the remote target has no local port
    owners = PortOwners().owners(
        [os.getpid(), server.child, server.grandchild, os.getppid(), 999_999_999], ports)
    # the listener, its child and grandchild; not its parent, not a pid that does not exist
    assert owners == {os.getpid(): url, server.child: url, server.grandchild: url}


def test_gpu_processes_are_named_after_their_server(server: Server) -> None:
    nvml = FakePynvml([
        FakeDevice(uuid="GPU-0", compute=[(server.child, 70 * GIB)]),
        FakeDevice(uuid="GPU-1", compute=[(server.grandchild, 60 * GIB),
                                          (os.getppid(), 1 * GIB)]),  # someone else's
        FakeDevice(uuid="GPU-2", used=0),
    ])
    gpus = NvmlReader(nvml).read()
    targets = _targets(server.port)
    pids = [p.pid for gpu in gpus for p in gpu.processes]
    owners = PortOwners().owners(pids, local_ports(targets))
    states = [TargetState(t, "up", kind="vllm") for t in targets]
    first, second, idle = gpu_views(gpus, owners, states)
    label = f"127.0.0.1:{server.port}"
    assert [(o.label, o.by) for o in first.owners] == [(label, "process")]
    assert first.process_owners[server.child].label == label
    assert [o.label for o in second.owners] == [label]
    assert second.process_owners[server.grandchild].label == label
    assert os.getppid() not in second.process_owners
    assert idle.owners == () and idle.host == first.host


def test_proc_is_read_rarely(server: Server) -> None:
    now = [0.0]
    owners = PortOwners(ttl_s=30.0, clock=lambda: now[0])
    ports = local_ports(_targets(server.port))
    for step in range(10):  # the app asks every 2 s
        now[0] = 2.0 * step
        assert owners.owners([server.child], ports)
    assert owners.scans == 1  # within the TTL, the same question is answered from memory
    owners.owners([server.child, server.grandchild], ports)  # a new GPU process: look again
    assert owners.scans == 2
    now[0] = 60.0
    owners.owners([server.child, server.grandchild], ports)  # the TTL ran out
    assert owners.scans == 3


def test_a_server_elsewhere_owns_no_local_process(server: Server) -> None:
    ports = local_ports([Target.from_spec(f"10.9.9.9:{server.port}")])
    assert ports == {}
    assert PortOwners().owners([server.child], ports) == {}


def test_no_listener_on_the_port_means_no_owner() -> None:
    with socket.socket() as unbound:
        unbound.bind(("127.0.0.1", 0))  # bound, never listening
        port = unbound.getsockname()[1]
        owners = PortOwners().owners([os.getpid()], {port: "x"})
    assert owners == {}


def test_every_process_of_ours_in_a_python_child(server: Server) -> None:
    # a Python child (as vLLM spawns its EngineCore with multiprocessing "spawn")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ports = local_ports(_targets(server.port))
        assert child.pid in PortOwners().owners([child.pid], ports)
    finally:
        child.kill()
        child.wait()


def test_nothing_to_look_for_reads_nothing(tmp_path: Path) -> None:
    owners = PortOwners(proc_root=tmp_path)  # an empty /proc: any read would find nothing
    assert owners.owners([os.getpid()], {}) == {} and owners.owners([], {80: "x"}) == {}
    assert owners.scans == 0
