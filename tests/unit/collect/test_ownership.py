"""Which server a GPU process belongs to, read from a /proc laid out as Linux lays it out
(a folder per process, ``stat``, ``fd/`` links, ``net/tcp`` and ``tcp6``): the process
listening on a server's port and everything below it is that server's; nothing else is,
whatever odd or hostile /proc content is met on the way.

Local ownership for real: a listening socket in this test process (the "API server"),
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

from kvtop.collect import ownership
from kvtop.collect.nvml import NvmlReader
from kvtop.collect.ownership import PortOwners
from kvtop.collect.target import Target
from kvtop.derive.gpu_owners import gpu_views, local_ports
from kvtop.derive.tracker import TargetState
from tests.fakes.fake_nvml import GIB, FakeDevice, FakePynvml

TCP_HEAD = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
            "  timeout inode\n")


def _socket_line(port: int, inode: int, state: str = "0A", v6: bool = False) -> str:
    address = "0" * 32 if v6 else "0100007F"
    return (f"   0: {address}:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000"
            f" 00000000     0        0 {inode} 1 0000000000000000 100 0 0 10 0\n")


class Proc:
    """A /proc under ``root``: processes with a parent and open sockets, and socket tables."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "net").mkdir(parents=True)
        self.tcp, self.tcp6 = [TCP_HEAD], [TCP_HEAD]
        self.write_tables()

    def write_tables(self) -> None:
        (self.root / "net" / "tcp").write_text("".join(self.tcp))
        (self.root / "net" / "tcp6").write_text("".join(self.tcp6))

    def listen(self, port: int, inode: int, *, v6: bool = False, state: str = "0A") -> None:
        (self.tcp6 if v6 else self.tcp).append(_socket_line(port, inode, state, v6))
        self.write_tables()

    def process(self, pid: int, parent: int, *sockets: int, name: str = "python3") -> None:
        folder = self.root / str(pid)
        (folder / "fd").mkdir(parents=True)
        (folder / "stat").write_text(f"{pid} ({name}) S {parent} {pid} {pid} 0 -1 4194560\n")
        (folder / "fd" / "0").symlink_to("/dev/null")
        (folder / "fd" / "1").symlink_to("pipe:[777]")
        for n, inode in enumerate(sockets, start=3):
            (folder / "fd" / str(n)).symlink_to(f"socket:[{inode}]")


@pytest.fixture
def proc(tmp_path: Path) -> Proc:
    return Proc(tmp_path / "proc")


def owners_of(proc: Proc, pids: list[int], ports: dict[int, str]) -> dict[int, str]:
    return PortOwners(proc.root).owners(pids, ports)


def test_the_listener_and_every_process_below_it_are_the_servers(proc: Proc) -> None:
    proc.listen(8000, 501)
    proc.listen(9000, 502, v6=True)
    proc.process(100, 1, 501)  # the API server on 8000
    proc.process(101, 100)  # EngineCore
    proc.process(102, 101)  # a tensor-parallel worker
    proc.process(200, 1, 502)  # another server, on 9000 over IPv6
    proc.process(201, 200)
    proc.process(300, 1)  # a training job: nobody's
    ports = {8000: "a", 9000: "b"}
    assert owners_of(proc, [100, 101, 102, 201, 300, 999], ports) == {
        100: "a", 101: "a", 102: "a", 201: "b"}
    assert owners_of(proc, [102, 201], {9000: "b"}) == {201: "b"}


def test_a_socket_connected_to_the_port_is_not_the_server(proc: Proc) -> None:
    proc.listen(8000, 501, state="01")  # ESTABLISHED: a client of the server, say
    proc.process(100, 1, 501)
    assert owners_of(proc, [100], {8000: "a"}) == {}


def test_a_process_name_with_spaces_and_parentheses_does_not_hide_its_parent(
        proc: Proc) -> None:
    proc.listen(8000, 501)
    proc.process(100, 1, 501)
    proc.process(101, 100, name="VLLM::Worker) 1 2 (x")
    assert owners_of(proc, [101], {8000: "a"}) == {101: "a"}


def test_odd_lines_of_the_socket_tables_are_skipped_and_the_rest_read(proc: Proc) -> None:
    proc.tcp += ["   1: 0100007F:1F40 00000000:0000 0A\n",  # too short
                 _socket_line(0, 600).replace(":0000 ", ":ZZZZ ", 1),  # not hex
                 _socket_line(8000, 0).replace(" 0 1 0000", " x 1 0000"),  # no inode
                 "   2: 0100007F 00000000:0000 0A 0 0 0 0 0 601 1\n"]  # no port
    proc.listen(8000, 501)
    proc.tcp.append("   3: 0100007F:2328 00000000:0000 0A 0 0 0 0 0 502\n")  # cut after the inode
    proc.tcp6.append(_socket_line(0, 503, v6=True).replace(  # the port after the last colon
        "0" * 32 + ":0000", "0000:0000:0000:0000:0000:0000:0000:0001:2710"))
    proc.write_tables()
    proc.process(100, 1, 501, 600, 601)
    proc.process(200, 1, 502)
    proc.process(300, 1, 503)
    assert owners_of(proc, [100, 200, 300], {8000: "a", 9000: "b", 10000: "c"}) == {
        100: "a", 200: "b", 300: "c"}


def test_without_an_ipv6_table_the_ipv4_one_is_read(proc: Proc) -> None:
    proc.listen(8000, 501)
    (proc.root / "net" / "tcp6").unlink()
    proc.process(100, 1, 501)
    assert owners_of(proc, [100], {8000: "a"}) == {100: "a"}


def test_without_an_ipv4_table_the_ipv6_one_is_read(proc: Proc) -> None:
    proc.listen(8000, 501, v6=True)
    (proc.root / "net" / "tcp").unlink()
    proc.process(100, 1, 501)
    assert owners_of(proc, [100], {8000: "a"}) == {100: "a"}


def test_in_a_container_the_server_may_be_pid_2(proc: Proc) -> None:
    # tini or dumb-init is pid 1 of the container's namespace, the API server pid 2
    proc.listen(8000, 501)
    proc.process(1, 0, name="tini")
    proc.process(2, 1, 501)
    proc.process(3, 2)
    assert owners_of(proc, [2, 3], {8000: "a"}) == {2: "a", 3: "a"}


def test_a_socket_pid_1_holds_makes_no_process_a_servers(proc: Proc) -> None:
    # systemd listens for socket-activated services: it is every process's ancestor
    proc.listen(8000, 501)
    proc.process(1, 0, 501, name="systemd")
    proc.process(100, 1)
    assert owners_of(proc, [100], {8000: "a"}) == {}


def test_the_search_goes_up_a_deep_tree_so_far_and_stops_in_a_loop(proc: Proc) -> None:
    proc.listen(8000, 501)
    proc.process(1000, 1, 501)
    for pid in range(1001, 1065):  # a chain of 65 processes: 64 are looked at
        proc.process(pid, pid - 1)
    top, bottom = 1063, 1064
    assert owners_of(proc, [top, bottom], {8000: "a"}) == {top: "a"}
    proc.process(5, 6)
    proc.process(6, 5)  # a parent loop (pid reuse while reading): it ends, nobody's
    assert owners_of(proc, [5], {8000: "a"}) == {}


def test_processes_gone_or_unreadable_on_the_way_are_nobodys(proc: Proc) -> None:
    proc.listen(8000, 501)
    proc.process(100, 1, 501)
    proc.process(101, 100)
    (proc.root / "101" / "stat").write_text("101 (cut short)")  # no parent field
    proc.process(102, 100)
    (proc.root / "102" / "stat").write_text("102 (x) S ppid\n")  # not a number
    proc.process(103, 100)
    (proc.root / "103" / "fd" / "5").write_text("not a link")
    proc.process(104, 100)
    (proc.root / "104" / "stat").unlink()  # gone between its listing and its parent's
    proc.process(105, 100)
    (proc.root / "105" / "stat").write_text("105 S 100 105 105")  # no name in parentheses
    assert owners_of(proc, [101, 102, 103, 104, 105, 106], {8000: "a"}) == {103: "a"}


def test_a_process_whose_fds_are_unreadable_is_named_and_the_next_scan_starts_afresh(
        proc: Proc, monkeypatch: pytest.MonkeyPatch) -> None:
    proc.listen(8000, 501)
    proc.process(100, 1, 501)
    proc.process(200, 1)  # another user's process: its fd/ cannot be listed
    proc.process(300, 1)
    listdir = os.listdir

    def denied_for_200(path: Path) -> list[str]:
        if Path(path) == proc.root / "200" / "fd":
            raise PermissionError(13, "Permission denied")
        return listdir(path)

    monkeypatch.setattr(ownership.os, "listdir", denied_for_200)
    owners = PortOwners(proc.root)
    assert owners.owners([100, 200, 300], {8000: "a"}) == {100: "a"}
    assert owners.denied == {200}
    assert owners.owners([100, 300], {8000: "a"}) == {100: "a"}
    assert owners.denied == set()


def test_with_no_server_listening_no_process_is_looked_at(
        proc: Proc, monkeypatch: pytest.MonkeyPatch) -> None:
    proc.process(100, 1)
    looked: list[object] = []
    monkeypatch.setattr(ownership.os, "listdir", lambda path: looked.append(path) or [])
    assert owners_of(proc, [100], {8000: "a"}) == {} and looked == []


def test_an_answer_is_kept_for_the_ttl_unless_the_question_changes(proc: Proc) -> None:
    now = [100.0]
    owners = PortOwners(proc.root, ttl_s=30.0, clock=lambda: now[0])
    proc.listen(8000, 501)
    proc.process(100, 1, 501)
    proc.process(101, 1)
    assert owners.owners([100, 101], {8000: "a"}) == {100: "a"}
    proc.process(102, 101)
    (proc.root / "101" / "fd" / "9").symlink_to("socket:[501]")  # 101 holds it too now
    now[0] = 129.5
    assert owners.owners([101, 100], {8000: "a"}) == {100: "a"} and owners.scans == 1
    assert owners.owners([100, 101], {8000: "b"}) == {100: "b", 101: "b"}  # renamed
    assert owners.scans == 2
    assert owners.owners([100, 101, 102], {8000: "b"})[102] == "b"  # a new process
    now[0] = 159.5  # exactly the TTL after the last scan: worked out again
    (proc.root / "101" / "fd" / "9").unlink()
    assert owners.owners([100, 101, 102], {8000: "b"}) == {100: "b"}
    assert owners.scans == 4


def test_the_socket_table_is_read_once_in_30_seconds_unless_told(proc: Proc) -> None:
    now = [1000.0]
    owners = PortOwners(proc.root, clock=lambda: now[0])
    proc.listen(8000, 501)
    proc.process(100, 1, 501)
    proc.process(200, 1, 502)
    assert owners.owners([100, 200], {8000: "a", 9000: "b"}) == {100: "a"}
    proc.listen(9000, 502)  # a server started since: seen once the table is read again
    now[0] = 1029.0
    assert owners.owners([200], {8000: "a", 9000: "b"}) == {}
    now[0] = 1030.0
    assert owners.owners([100, 200], {8000: "a", 9000: "b"}) == {100: "a", 200: "b"}


def test_an_fd_closed_while_it_is_read_is_passed_over_not_the_end_of_the_list(
        proc: Proc, monkeypatch: pytest.MonkeyPatch) -> None:
    proc.listen(8000, 501)
    proc.process(100, 1, 501)
    (proc.root / "100" / "fd" / "00").write_text("closed")  # readlink fails on it
    listdir = os.listdir
    monkeypatch.setattr(ownership.os, "listdir", lambda path: sorted(listdir(path)))
    assert owners_of(proc, [100], {8000: "a"}) == {100: "a"}


def test_the_workers_of_one_server_have_its_fds_listed_once_a_scan(
        proc: Proc, monkeypatch: pytest.MonkeyPatch) -> None:
    proc.listen(8000, 501)
    proc.process(100, 1, 501)
    proc.process(101, 100)  # EngineCore
    workers = list(range(110, 118))  # eight tensor-parallel workers
    for pid in workers:
        proc.process(pid, 101)
    listed: list[str] = []
    listdir = os.listdir

    def counted(path: Path) -> list[str]:
        listed.append(Path(path).parent.name)
        return listdir(path)

    monkeypatch.setattr(ownership.os, "listdir", counted)
    assert owners_of(proc, workers, {8000: "a"}) == dict.fromkeys(workers, "a")
    assert sorted(listed) == sorted(["100", "101", *map(str, workers)])


needs_proc = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


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


@needs_proc
def test_port_to_process_tree(server: Server) -> None:
    ports = local_ports(_targets(server.port))
    url = f"http://127.0.0.1:{server.port}/metrics"
    assert ports == {server.port: url}  # the remote target has no local port
    owners = PortOwners().owners(
        [os.getpid(), server.child, server.grandchild, os.getppid(), 999_999_999], ports)
    # the listener, its child and grandchild; not its parent, not a pid that does not exist
    assert owners == {os.getpid(): url, server.child: url, server.grandchild: url}


@needs_proc
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


@needs_proc
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


@needs_proc
def test_a_server_elsewhere_owns_no_local_process(server: Server) -> None:
    ports = local_ports([Target.from_spec(f"10.9.9.9:{server.port}")])
    assert ports == {}
    assert PortOwners().owners([server.child], ports) == {}


@needs_proc
def test_no_listener_on_the_port_means_no_owner() -> None:
    with socket.socket() as unbound:
        unbound.bind(("127.0.0.1", 0))  # bound, never listening
        port = unbound.getsockname()[1]
        owners = PortOwners().owners([os.getpid()], {port: "x"})
    assert owners == {}


@needs_proc
def test_every_process_of_ours_in_a_python_child(server: Server) -> None:
    # a Python child (as vLLM spawns its EngineCore with multiprocessing "spawn")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ports = local_ports(_targets(server.port))
        assert child.pid in PortOwners().owners([child.pid], ports)
    finally:
        child.kill()
        child.wait()


@needs_proc
def test_nothing_to_look_for_reads_nothing(tmp_path: Path) -> None:
    owners = PortOwners(proc_root=tmp_path)  # an empty /proc: any read would find nothing
    assert owners.owners([os.getpid()], {}) == {} and owners.owners([], {80: "x"}) == {}
    assert owners.scans == 0
