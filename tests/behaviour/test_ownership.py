"""Which server a GPU process belongs to, read from a /proc laid out as Linux lays it out
(a folder per process, ``stat``, ``fd/`` links, ``net/tcp`` and ``tcp6``): the process
listening on a server's port and everything below it is that server's; nothing else is,
whatever odd or hostile /proc content is met on the way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtop.collect import ownership
from kvtop.collect.ownership import PortOwners

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
