"""End to end: simulated servers over HTTP, their /metrics against their ground truth."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtop.sim.engine import EngineConfig, RequestSpec
from kvtop.sim.exposition import CONTENT_TYPE
from kvtop.sim.faults import Fault, malform
from kvtop.sim.server import SimConfig, SimFleet, SimServer
from kvtop.sim.simulation import Simulation, Truth
from kvtop.sim.workloads import make_workload
from tests.support.paths import REPO
from tests.support.waiting import DEADLINE_S, eventually, wait_until


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(parsed: dict, name: str) -> float:
    (value,) = parsed[name].values()
    return value


def assert_v1_matches(parsed: dict, truth: Truth) -> None:
    assert one(parsed, "vllm:kv_cache_usage_perc") == truth.kv_usage
    assert one(parsed, "vllm:num_requests_running") == truth.running
    assert one(parsed, "vllm:num_requests_waiting") == truth.waiting
    assert one(parsed, "vllm:prefix_cache_queries_total") == truth.prefix_queries
    assert one(parsed, "vllm:prefix_cache_hits_total") == truth.prefix_hits
    assert one(parsed, "vllm:num_preemptions_total") == truth.preemptions
    assert one(parsed, "vllm:generation_tokens_total") == truth.generation_tokens
    assert one(parsed, "vllm:prompt_tokens_total") == truth.prompt_tokens
    success = {dict(k)["finished_reason"]: v
               for k, v in parsed["vllm:request_success_total"].items()}
    assert success == dict(truth.finished)


async def scrape(client: httpx.AsyncClient, server: SimServer) -> dict:
    response = await client.get(f"{server.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)


async def test_fleet_serves_each_name_set_matching_ground_truth() -> None:
    configs = [SimConfig(names=n, speed=10.0, seed=i, engine=EngineConfig(num_gpu_blocks=800))
               for i, n in enumerate(("v1", "v0", "sglang"))]
    async with SimFleet(configs) as fleet, httpx.AsyncClient(timeout=5) as client:
        assert len(set(fleet.urls)) == 3
        v1, v0, sg = fleet.servers
        await eventually(lambda: all(s.truth().generation_tokens > 0 for s in fleet.servers)
                         and v1.truth().prefix_hits > 0, "tokens generated and prefix hits")
        parsed = await scrape(client, v1)
        truth = v1.last_scrape
        assert truth is not None and truth.generation_tokens > 0 and truth.prefix_hits > 0
        assert_v1_matches(parsed, truth)
        parsed = await scrape(client, v0)
        v0_truth = v0.last_scrape  # V0 has no null block: usage divides by num_gpu_blocks
        assert one(parsed, "vllm:gpu_cache_usage_perc") == (
            v0_truth.used_blocks / v0_truth.num_gpu_blocks)
        assert one(parsed, "vllm:num_requests_running") == v0.last_scrape.running
        parsed = await scrape(client, sg)
        assert one(parsed, "sglang:num_queue_reqs") == sg.last_scrape.waiting
        assert one(parsed, "sglang:num_used_tokens") == sg.last_scrape.used_blocks * 16
        assert (await client.get(f"{v1.url}/version")).json() == {"version": "0.33.0"}
        assert (await client.get(f"{v0.url}/version")).json() == {"version": "0.7.3"}
        assert (await client.get(f"{sg.url}/version")).status_code == 404
        assert (await client.get(f"{v1.url}/health")).status_code == 200
        models = (await client.get(f"{v1.url}/v1/models")).json()
        assert models["data"][0]["id"] == configs[0].model_name


async def test_token_required_when_configured() -> None:
    config = SimConfig(faults=[Fault(0.0, "auth", "s3cret")])
    async with SimFleet([config]) as fleet, httpx.AsyncClient(timeout=5) as client:
        url = fleet.urls[0]
        for path in ("/metrics", "/v1/models"):
            assert (await client.get(url + path)).status_code == 401
            wrong = await client.get(url + path, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            ok = await client.get(url + path, headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == 200
        assert (await client.get(url + "/health")).status_code == 200


async def test_hanging_slow_and_malformed_metrics() -> None:
    async with SimFleet([SimConfig()]) as fleet, httpx.AsyncClient() as client:
        server = fleet.servers[0]
        server.simulation.inject("hang")
        with pytest.raises(httpx.TimeoutException):
            await client.get(f"{server.url}/metrics", timeout=0.3)
        server.simulation.inject("heal")
        server.simulation.inject("slow", 0.3)
        start = time.monotonic()
        assert (await client.get(f"{server.url}/metrics", timeout=5)).status_code == 200
        assert time.monotonic() - start >= 0.3
        server.simulation.inject("heal")
        server.simulation.inject("malformed")
        body = (await client.get(f"{server.url}/metrics", timeout=5)).text
        with pytest.raises(ValueError):
            list(text_string_to_metric_families(body))
        server.simulation.inject("heal")
        await scrape(client, server)


async def test_hang_does_not_block_shutdown() -> None:
    fleet = SimFleet([SimConfig(faults=[Fault(0.0, "hang")])])
    await fleet.start()
    runner = fleet.servers[0]._runner
    assert runner is not None and runner.server is not None
    async with httpx.AsyncClient() as client:
        pending = asyncio.create_task(client.get(f"{fleet.urls[0]}/metrics", timeout=60))
        await eventually(lambda: runner.server.connections, "the hanging request to arrive")
        await asyncio.wait_for(fleet.stop(), DEADLINE_S)
        # released by the stop, not by the client's deadline
        (answer,) = await asyncio.gather(pending, return_exceptions=True)
    assert not isinstance(answer, httpx.TimeoutException), answer


async def test_restart_resets_counters_and_created() -> None:
    config = SimConfig(autostep=False)
    async with SimFleet([config]) as fleet, httpx.AsyncClient(timeout=5) as client:
        server = fleet.servers[0]
        server.simulation.advance_to(20.0)
        before = await scrape(client, server)
        assert one(before, "vllm:generation_tokens_total") > 0
        await asyncio.sleep(0.05)  # so the new process start time differs
        server.simulation.inject("restart")
        after = await scrape(client, server)
        assert_v1_matches(after, server.last_scrape)
        assert one(after, "vllm:generation_tokens_total") == 0
        assert one(after, "vllm:kv_cache_usage_perc") == 0.0
        assert one(after, "vllm:prompt_tokens_created") > one(before,
                                                              "vllm:prompt_tokens_created")
        assert server.truth().restarts == 1


async def test_stall_freezes_counters_while_waiting_grows() -> None:
    config = SimConfig(speed=20.0, faults=[Fault(2.0, "stall")])
    async with SimFleet([config]) as fleet, httpx.AsyncClient(timeout=5) as client:
        server = fleet.servers[0]
        await eventually(lambda: server.simulation.clock >= 3.0, "the stall (at 2 s) under way")
        first = await scrape(client, server)
        waiting = one(first, "vllm:num_requests_waiting")
        await eventually(lambda: server.truth().waiting > waiting, "the queue to grow")
        second = await scrape(client, server)
        assert_v1_matches(second, server.last_scrape)
        assert one(second, "vllm:generation_tokens_total") == one(
            first, "vllm:generation_tokens_total") > 0
        assert one(second, "vllm:num_requests_waiting") > one(first, "vllm:num_requests_waiting")


async def test_leak_shows_at_idle_as_the_leaked_blocks() -> None:
    spec = {"rate": 20.0, "output_mean": 50.0, "prompt_mean": 300.0}
    config = SimConfig(autostep=False, workload_params=spec, faults=[Fault(0.0, "leak", 0.3)])
    async with SimFleet([config]) as fleet, httpx.AsyncClient(timeout=5) as client:
        server = fleet.servers[0]
        server.simulation.advance_to(10.0)
        engine = server.simulation.engine
        while engine.has_work:  # drain without letting new requests arrive
            engine.step()
        parsed = await scrape(client, server)
        truth = server.last_scrape
        assert truth is not None
        assert truth.running == truth.waiting == 0 and truth.leaked_blocks > 0
        assert_v1_matches(parsed, truth)
        assert truth.kv_usage == pytest.approx(truth.leaked_blocks / 1999, rel=1e-12)


def test_kvtop_sim_command_serves_until_interrupted() -> None:
    script = ("import argparse, sys\n"
              "from kvtop.commands.sim import add_parser, run\n"
              "p = argparse.ArgumentParser(prog='kvtop')\n"
              "add_parser(p.add_subparsers(), 'serve simulated vLLM servers')\n"
              "a = p.parse_args(sys.argv[1:])\n"
              "sys.exit(run(a))\n")
    env = {**os.environ, "SIM_TOKEN": "t0k"}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "sim", "--port", "0", "--count", "2", "--speed", "5",
         "--names", "v0", "--require-token-env", "SIM_TOKEN"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        urls = [proc.stdout.readline().strip() for _ in range(2)]  # type: ignore[union-attr]
        assert all(u.startswith("http://127.0.0.1:") and u.endswith("/metrics") for u in urls)
        assert httpx.get(urls[0], timeout=5).status_code == 401
        body = httpx.get(urls[1], headers={"Authorization": "Bearer t0k"}, timeout=5).text
        assert "vllm:gpu_cache_usage_perc" in body
        cpu_before = _cpu_s(proc.pid)
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT),
                   "kvtop sim to exit after SIGINT")  # without reaping it: its usage is next
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    # What a stop costs is CPU work, which a loaded machine stretches but can't add to: the
    # interpreter's teardown once took 0.10-0.14 s of it (1.3-5.9 s on a machine at load
    # 14), now ~0.03 s. Clock ticks are 10 ms.
    assert usage.ru_utime + usage.ru_stime - cpu_before < 0.08


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a live process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_routes_as_vllm_033_has_them_and_the_name_filter() -> None:
    """`/metrics` is everything, uncompressed; `/metrics/` is prometheus_client's handler:
    gzip, and with `name[]` exactly the named samples (with their families' HELP/TYPE),
    or nothing from a multiprocess-mode server (v0, SGLang)."""
    names = ["vllm:num_requests_running", "vllm:e2e_request_latency_seconds_bucket",
             "vllm:prompt_tokens_total", "vllm:not_a_metric"]
    configs = [SimConfig(names=n, autostep=False) for n in ("v1", "v0", "sglang")]
    async with SimFleet(configs) as fleet, httpx.AsyncClient(timeout=5) as client:
        v1, v0, sg = fleet.servers
        whole = await client.get(f"{v1.url}/metrics")
        assert "content-encoding" not in whole.headers
        slashed = await client.get(f"{v1.url}/metrics/")
        assert slashed.headers["content-encoding"] == "gzip"
        named = await client.get(f"{v1.url}/metrics/", params=[("name[]", n) for n in names])
        assert named.headers["content-encoding"] == "gzip"
        expected = {name: series for name, series in parse(whole.text).items()
                    if name in names}
        assert parse(named.text) == expected
        assert set(expected) == set(names[:3])
        helped = {line.split()[2] for line in named.text.splitlines() if line.startswith("#")}
        assert helped == {"vllm:num_requests_running", "vllm:e2e_request_latency_seconds",
                          "vllm:prompt_tokens_total"}
        for server in (v0, sg):
            answer = await client.get(f"{server.url}/metrics/", params={"name[]": names[0]})
            assert answer.status_code == 200 and answer.content == b""
            assert parse((await client.get(f"{server.url}/metrics/")).text)


async def test_kv_events_count_every_block_the_pool_stored_and_removed() -> None:
    """The simulator publishes its pool's KV events as vLLM does; kvtop's subscriber and
    anatomy count exactly what the pool did, and /metrics has the residency histograms."""
    from kvtop.collect.kv_endpoint import parse_endpoint
    from kvtop.collect.kv_events import KvEventBatch
    from kvtop.collect.kv_subscriber import KvEventsSubscriber
    from kvtop.derive.kv_anatomy import KvAnatomy

    config = SimConfig(engine=EngineConfig(num_gpu_blocks=150, kv_cache_metrics=True),
                       speed=20.0, kv_events_port=0, seed=3)
    anatomy, batches = KvAnatomy(), []

    def fold(batch: KvEventBatch) -> None:
        batches.append(batch)
        anatomy.fold(batch)

    async with SimFleet([config]) as fleet:
        server = fleet.servers[0]
        assert server.kv_events is not None
        endpoint = parse_endpoint(server.kv_events.url, replay=server.kv_events.replay_url)
        subscriber = KvEventsSubscriber(endpoint, fold)
        stop = asyncio.Event()
        task = asyncio.create_task(subscriber.run(stop))
        pool = lambda: server.simulation.engine.pool  # noqa: E731
        await eventually(lambda: pool().removed_blocks > 300, "a few pool turnovers")
        assert server._driver is not None
        server._driver.cancel()  # the pool stands still from here
        await asyncio.gather(server._driver, return_exceptions=True)
        server.publish_kv_events()
        await eventually(lambda: batches and batches[-1].seq == server.kv_events.seq - 1,
                         "every batch delivered")
        async with httpx.AsyncClient() as client:
            parsed = await scrape(client, server)
        stop.set()
        await task
    stats = anatomy.stats(0.0, pool().usable_blocks)
    assert stats.stored_total == pool().stored_blocks
    assert stats.removed_total == pool().removed_blocks
    assert stats.population == pool().num_cached_hashes()
    assert stats.lost_batches == stats.malformed == 0 and stats.removed_unknown == 0
    lifetimes = parsed["vllm:kv_block_lifetime_seconds_count"]
    assert one(parsed, "vllm:kv_block_lifetime_seconds_count") > 0 and len(lifetimes) == 1


# --- each route's answer in full, the clock driven by hand ------------------------------------

UNAUTHORIZED = {"error": "Unauthorized"}


async def test_models_health_and_version_answer_as_vllm_does() -> None:
    engine = EngineConfig(num_gpu_blocks=101, block_size=8)  # model_len (101 - 1) * 8
    configs = [SimConfig(model_name="m-7b", names=names, autostep=False, engine=engine)
               for names in ("v1", "v0", "sglang")]
    async with SimFleet(configs) as fleet, httpx.AsyncClient(timeout=5) as client:
        for server in fleet.servers:
            models = await client.get(f"{server.url}/v1/models")
            assert models.json() == {"object": "list", "data": [{
                "id": "m-7b", "object": "model",
                "created": int(server.simulation.engine.created), "owned_by": "vllm",
                "root": "m-7b", "parent": None, "max_model_len": 800}]}
            health = await client.get(f"{server.url}/health")
            assert (health.status_code, health.content) == (200, b"")
        v1, v0, sglang = fleet.servers
        assert (await client.get(f"{v1.url}/version")).json() == {"version": "0.33.0"}
        assert (await client.get(f"{v0.url}/version")).json() == {"version": "0.7.3"}
        assert (await client.get(f"{sglang.url}/version")).status_code == 404


async def test_without_the_bearer_token_the_answer_is_401_and_nothing_is_rendered() -> None:
    config = SimConfig(autostep=False, faults=[Fault(0.0, "auth", "s3cret")])
    async with SimFleet([config]) as fleet, httpx.AsyncClient(timeout=5) as client:
        server = fleet.servers[0]
        for path in ("/metrics", "/metrics/", "/v1/models"):
            for headers in ({}, {"Authorization": "s3cret"}, {"Authorization": "Bearer s3cre"}):
                answer = await client.get(f"{server.url}{path}", headers=headers)
                assert (answer.status_code, answer.json(), answer.headers["www-authenticate"]
                        ) == (401, UNAUTHORIZED, "Bearer")
        assert (server.scrapes, server.last_scrape) == (0, None)
        ok = await client.get(f"{server.url}/metrics",
                              headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and server.scrapes == 1


async def test_each_metrics_answer_is_counted_and_records_the_truth_it_shows() -> None:
    async with SimFleet([SimConfig(autostep=False)]) as fleet, \
            httpx.AsyncClient(timeout=5) as client:
        server = fleet.servers[0]
        server.simulation.advance_to(5.0)
        answer = await client.get(f"{server.url}/metrics", headers={"Accept-Encoding": "gzip"})
        assert answer.headers["content-type"] == CONTENT_TYPE
        assert "content-encoding" not in answer.headers  # vLLM's /metrics never compresses
        assert answer.text == server.render()
        assert server.last_scrape == server.truth() and server.scrapes == 1
        plain = await client.get(f"{server.url}/metrics/", headers={"Accept-Encoding": "br"})
        assert "content-encoding" not in plain.headers and plain.text == server.render()
        assert server.scrapes == 2


async def test_a_metrics_answer_waits_as_long_as_told() -> None:
    async with SimFleet([SimConfig(autostep=False)]) as fleet, \
            httpx.AsyncClient(timeout=5) as client:
        server = fleet.servers[0]
        server.simulation.inject("slow", 0.2)
        started = time.monotonic()
        assert (await client.get(f"{server.url}/metrics")).status_code == 200
        assert time.monotonic() - started >= 0.2
        server.simulation.inject("slow", 0.0)


async def test_a_malformed_exposition_that_is_empty_stays_empty() -> None:
    configs = [SimConfig(names="v0", autostep=False), SimConfig(autostep=False)]
    async with SimFleet(configs) as fleet, httpx.AsyncClient(timeout=5) as client:
        v0, v1 = fleet.servers
        for server in fleet.servers:
            server.simulation.inject("malformed")
        named = await client.get(f"{v0.url}/metrics/", params={"name[]": "vllm:x"})
        assert (named.status_code, named.content) == (200, b"")
        broken = await client.get(f"{v1.url}/metrics")
        assert broken.text == malform(v1.render())


async def test_a_hanging_metrics_answer_is_released_by_the_stop_with_a_503() -> None:
    server = SimServer(SimConfig(autostep=False, faults=[Fault(0.0, "hang")]))
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    assert server._runner is not None and server._runner.server is not None
    await eventually(lambda: server._runner.server.connections, "the request to arrive")
    stopping = asyncio.create_task(server.stop())
    status = await asyncio.wait_for(reader.readline(), DEADLINE_S)
    await asyncio.wait_for(stopping, DEADLINE_S)
    writer.close()
    assert status == b"HTTP/1.1 503 Service Unavailable\r\n" and server.scrapes == 0


def test_kv_events_turn_the_engines_events_on_and_are_off_without_a_port() -> None:
    on = SimServer(SimConfig(kv_events_port=0, kv_events_replay_port=0))
    assert on.simulation.engine.config.kv_events and on.config.engine.kv_events
    assert on.kv_events is not None
    off = SimServer(SimConfig())
    assert off.kv_events is None and not off.simulation.engine.config.kv_events
    off.publish_kv_events()  # nothing to publish to: nothing happens


async def test_kv_events_are_published_per_step_and_a_restart_starts_them_again() -> None:
    config = SimConfig(autostep=False, kv_events_port=0, seed=1)
    server = SimServer(config)
    await server.start()
    try:
        publisher = server.kv_events
        assert publisher is not None
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        assert low <= publisher.replay_port <= high  # ephemeral unless the config names one
        server.simulation.advance_to(5.0)
        engine = server.simulation.engine
        batches = list(engine.kv_batches)
        assert batches
        server.publish_kv_events()
        assert (publisher.seq, len(engine.kv_batches)) == (len(batches), 0)
        assert [msgspec.msgpack.decode(payload)[0] for _, payload in publisher.buffer] == [
            engine.created + clock for clock, _ in batches]
        server.publish_kv_events()  # nothing new: nothing sent
        assert publisher.seq == len(batches)
        server.simulation.inject("restart")
        server.simulation.advance_to(10.0)
        after = len(server.simulation.engine.kv_batches)
        server.publish_kv_events()
        assert [seq for seq, _ in publisher.buffer] == list(range(after))
    finally:
        await server.stop()


def test_due_at_is_a_tokens_wall_time_plus_a_tick_or_now_by_hand() -> None:
    async def due() -> tuple[float, float, float, float]:
        server = SimServer(SimConfig(speed=4.0, tick=0.5, autostep=False))
        loop = asyncio.get_running_loop()
        before = loop.time()
        by_hand = server.due_at(1e6)
        after = loop.time()
        server._anchor = default._anchor = (100.0, 2.0)
        return by_hand - before, after - by_hand, server.due_at(10.0), default.due_at(10.0)

    default = SimServer(SimConfig())
    early, late, driven, by_default = asyncio.run(due())
    assert early >= 0 and late >= 0
    assert driven == 100.0 + (10.0 - 2.0) / 4.0 + 0.5
    assert by_default == 100.0 + 8.0 + 0.02  # a 20 ms tick behind, at wall speed


async def test_a_fleet_that_cannot_start_stops_the_servers_it_started() -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        fleet = SimFleet([SimConfig(autostep=False),
                          SimConfig(autostep=False, port=taken.getsockname()[1])])
        with pytest.raises(OSError):
            await fleet.start()
        first = fleet.servers[0]
        assert first._closing.is_set()
        with pytest.raises(httpx.ConnectError):
            httpx.get(first.url, timeout=5)
    finally:
        taken.close()


async def test_a_fleet_serves_on_the_sockets_it_is_given() -> None:
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    kv = [(socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0)))
          for _ in range(2)]
    kv_ports = [(p.getsockname()[1], r.getsockname()[1]) for p, r in kv]  # ZeroMQ takes them
    fleet = SimFleet([SimConfig(autostep=False, kv_events_port=0) for _ in range(2)])
    await fleet.start(listeners, kv)
    try:
        assert [s.port for s in fleet.servers] == [s.getsockname()[1] for s in listeners]
        assert [(s.kv_events.port, s.kv_events.replay_port) for s in fleet.servers  # type: ignore[union-attr]
                ] == kv_ports
        async with httpx.AsyncClient(timeout=5) as client:
            for server in fleet.servers:
                assert (await client.get(f"{server.url}/health")).status_code == 200
    finally:
        await fleet.stop()
        for sock in listeners:
            sock.close()


async def test_a_simulation_that_keeps_up_follows_wall_time_times_its_speed() -> None:
    server = SimServer(SimConfig(workload="none", speed=10.0))
    await server.start()
    try:
        loop = asyncio.get_running_loop()
        await eventually(lambda: server._anchor is not None, "the stepping to start")
        anchor = server._anchor
        assert anchor is not None and anchor[1] == 0.0
        await asyncio.sleep(1.3)  # past max_lag (2 s) times speed in target plus clock
        clock, elapsed = server.simulation.clock, loop.time() - anchor[0]
        assert 1.3 * 10.0 * 0.5 <= clock <= elapsed * 10.0  # never ahead of it
        assert server._anchor == anchor  # nothing to catch up on: never re-anchored
    finally:
        await server.stop()


async def test_a_simulation_that_cannot_keep_up_runs_slower_and_leaves_the_loop_free() -> None:
    """At ten thousand times wall time the engine falls behind at once: each tick steps for
    a quarter of it at most, and the clock is re-anchored where it got to."""
    spec = {"rate": 200.0, "prompt_mean": 500.0, "output_mean": 200.0}
    server = SimServer(SimConfig(speed=10_000.0, workload_params=spec))
    await server.start()
    try:
        loop = asyncio.get_running_loop()
        await eventually(lambda: server._anchor is not None, "the stepping to start")
        first = server._anchor
        assert first is not None
        started, cpu = loop.time(), time.process_time()
        for _ in range(20):
            await asyncio.sleep(0.01)  # the loop keeps turning
        assert loop.time() - started < 1.5
        # a quarter of each tick at most (a loaded machine gives it less, never more)
        assert (time.process_time() - cpu) / (loop.time() - started) < 0.5
        # behind by less wall time than max_lag (2 s) can be: not re-anchored yet
        assert server._anchor == first
        await eventually(lambda: server._anchor != first, "a re-anchor")
        assert loop.time() - first[0] < 4.0  # soon after max_lag: the lag grows with time
        anchor = server._anchor
        assert anchor is not None and anchor[1] > 0.0
        assert server.simulation.clock < (loop.time() - first[0]) * 10_000.0  # behind
    finally:
        await server.stop()


async def test_a_client_that_accepts_no_encoding_gets_the_exposition_plain() -> None:
    async with SimFleet([SimConfig(autostep=False)]) as fleet, \
            httpx.AsyncClient(timeout=5) as client:
        del client.headers["accept-encoding"]  # httpx asks for gzip unless told not to
        server = fleet.servers[0]
        for path in ("/metrics", "/metrics/"):
            answer = await client.get(f"{server.url}{path}")
            assert answer.status_code == 200 and "content-encoding" not in answer.headers
            assert answer.text == server.render()


async def test_the_stepping_keeps_up_with_more_steps_than_one_batch_per_tick() -> None:
    """One long request decodes a token per 5.1 ms step: at ten times wall time a 20 ms tick
    needs ~39 steps, far more than one advance of 10 steps, yet little CPU. The clock must
    keep pace (within half, for a loaded machine), not crawl at 10 steps a tick."""
    config = SimConfig(speed=10.0, requests=[RequestSpec(0.0, 16, 30_000)])
    server = SimServer(config)
    await server.start()
    try:
        loop = asyncio.get_running_loop()
        await eventually(lambda: server._anchor is not None, "the stepping to start")
        anchor = server._anchor
        assert anchor is not None
        await asyncio.sleep(1.0)
        elapsed = loop.time() - anchor[0]
        assert server.truth().running == 1
        assert server.simulation.clock >= 0.5 * 10.0 * elapsed
    finally:
        await server.stop()


async def test_a_stop_ends_every_task_and_a_server_never_started_stops_too() -> None:
    await SimServer(SimConfig()).stop()
    server = SimServer(SimConfig(kv_events_port=0))
    await server.start()
    assert len(asyncio.all_tasks()) == 3  # this test, the stepping and the KV replay server
    await server.stop()
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_a_stop_with_an_answer_streaming_takes_half_a_second_not_a_minute() -> None:
    """aiohttp waits for open handlers before it cancels them (60 s unless told): a stream
    that never ends holds a stop for the half second the server allows."""
    server = SimServer(SimConfig(workload="none", speed=1.0))
    await server.start()
    async with httpx.AsyncClient(timeout=30) as client, client.stream(
            "POST", f"{server.url}/v1/completions",
            json={"prompt": "a b c", "max_tokens": 30_000, "stream": True}) as answer:
        lines = answer.aiter_lines()
        while not (await anext(lines)).startswith("data: "):
            pass
        loop = asyncio.get_running_loop()
        started = loop.time()
        await server.stop()
        assert 0.4 <= loop.time() - started < 1.2


async def test_a_client_that_hangs_up_on_a_whole_answer_aborts_it_at_once() -> None:
    """A whole answer writes nothing until its end, so only the handler's cancellation
    (vLLM's too) can tell the engine that nobody waits for it any more."""
    async with SimFleet([SimConfig(workload="none", speed=1.0)]) as fleet, \
            httpx.AsyncClient() as client:
        server = fleet.servers[0]
        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"{server.url}/v1/completions", timeout=0.3,
                              json={"prompt": "a b c", "max_tokens": 30_000})
        await eventually(lambda: server.truth().finished["abort"] == 1, "the abort")
        assert server.truth().running == 0


async def test_the_servers_log_no_access_lines(caplog: pytest.LogCaptureFixture) -> None:
    """The demo's servers run inside the terminal app: a log line per scrape would land on
    its screen."""
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    async with SimFleet([SimConfig(autostep=False)]) as fleet, \
            httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"{fleet.urls[0]}/health")).status_code == 200
    assert [r for r in caplog.records if r.name == "aiohttp.access"] == []


def truth_after(simulation: Simulation, seconds: float) -> tuple:
    simulation.advance_to(seconds)
    truth = simulation.truth()
    return (truth.generation_tokens, truth.prompt_tokens, truth.prefix_queries,
            truth.prefix_hits, dict(truth.finished), truth.leaked_requests)


def test_a_server_runs_its_configs_workload_with_its_seed_and_block_size() -> None:
    engine = EngineConfig(block_size=32)
    params = {"rate": 4.0, "groups": 2, "system_prompt_len": 256, "shared_frac": 0.9}
    leak = [Fault(0.0, "leak", 0.5)]  # which requests leak: the engine's seeded draws
    server = SimServer(SimConfig(seed=7, engine=engine, workload_params=params, faults=leak))
    expected = Simulation(engine, make_workload("synthetic", seed=7, block_size=32, **params),
                          leak, seed=7)
    assert truth_after(server.simulation, 30.0) == truth_after(expected, 30.0)
    assert server.simulation.truth().prefix_hits > 0


def test_the_requests_given_replace_the_workload() -> None:
    server = SimServer(SimConfig(requests=[RequestSpec(1.0, 100, 10)]))
    server.simulation.advance_to(60.0)
    assert (server.truth().prompt_tokens, server.truth().generation_tokens) == (100, 10)


def test_the_ports_are_the_configs_before_the_server_starts() -> None:
    server = SimServer(SimConfig(port=5000, kv_events_port=5001, kv_events_replay_port=5002))
    assert (server.port, server.url) == (5000, "http://127.0.0.1:5000")
    assert server.kv_events is not None
    assert (server.kv_events.port, server.kv_events.replay_port) == (5001, 5002)


async def test_by_default_the_simulated_clock_is_wall_time() -> None:
    server = SimServer(SimConfig(workload="none"))
    await server.start()
    try:
        loop = asyncio.get_running_loop()
        await eventually(lambda: server._anchor is not None, "the stepping to start")
        anchor = server._anchor
        assert anchor is not None
        await asyncio.sleep(0.5)
        assert 0.25 <= server.simulation.clock <= loop.time() - anchor[0]
    finally:
        await server.stop()


def test_a_config_without_a_seed_replays_seed_zero() -> None:
    server = SimServer(SimConfig(faults=[Fault(0.0, "leak", 0.5)]))
    expected = Simulation(EngineConfig(), make_workload("synthetic", seed=0, block_size=16),
                          [Fault(0.0, "leak", 0.5)], seed=0)
    assert truth_after(server.simulation, 30.0) == truth_after(expected, 30.0)
