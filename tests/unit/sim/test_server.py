"""End to end: simulated servers over HTTP, their /metrics against their ground truth."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtop.sim.engine import EngineConfig
from kvtop.sim.faults import Fault
from kvtop.sim.server import SimConfig, SimFleet, SimServer
from kvtop.sim.simulation import Truth
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
