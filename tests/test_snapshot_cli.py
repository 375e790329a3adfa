"""`kvtop snapshot` as a user runs it (a subprocess) against real HTTP servers on 127.0.0.1
that serve real scrapes and faults, all in one run: each target is reported right, in
bounded time, and the healthy ones are still right."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import pytest

from tests.derived_fixtures import vllm_08_idle
from tests.faultserver import FaultServer, closed_port, fixture
from tests.waiting import DEADLINE_S, eventually

TOKEN = "s3cret-token-for-tests"
LOADED_SLACK_S = 5.0  # what a busy 2-core machine may add to a kept deadline
IDLE, LOAD = "vllm-0.33.0-v1-twin-idle.txt", "vllm-0.33.0-v1-twin-under-load.txt"


async def run_kvtop(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), timeout=2 * DEADLINE_S)
    return proc.returncode or 0, out.decode(), err.decode(), time.monotonic() - started


def by_url(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {target["target"]: target for target in document["targets"]}


async def test_snapshot_reports_every_fault_and_keeps_healthy_targets_right() -> None:
    async with FaultServer(bodies=[fixture(LOAD), fixture(IDLE)]) as healthy, \
            FaultServer(bodies=[fixture(IDLE), fixture(LOAD)]) as restarting, \
            FaultServer() as faults:
        modes = ["hang", "auth", "error500", "garbage", "truncated", "big", "html", "notfound"]
        refused = f"http://127.0.0.1:{closed_port()}/metrics"
        urls = [healthy.url(), restarting.url(), faults.url("slow", "s=0.3"), refused,
                *(faults.url(m) for m in modes)]
        expected = dict(zip(urls[2:], ["up", "down", "timeout", "auth", "down", "bad_payload",
                                       "bad_payload", "bad_payload", "bad_payload",
                                       "bad_payload"], strict=True))
        code, out, err, _ = await run_kvtop(
            "snapshot", *urls, "--json", "--interval", "0.5", "--timeout", "2", "--no-gpu")
        reads = [r.at for r in healthy.requests if not r.path.endswith("/version")]
    assert code == 3, err  # some targets could not be read
    # The hung target held round 1 for its 2 s deadline, no longer: the healthy server's
    # second read came within deadline + interval (+ slack for a loaded machine).
    assert len(reads) == 2
    assert reads[1] - reads[0] < 2 + 0.5 + LOADED_SLACK_S, reads
    doc = json.loads(out)
    assert doc["kvtop_snapshot"] == 1 and doc["gpus"] == []
    targets = by_url(doc)
    statuses = {url: targets[url]["status"] for url in urls[2:]}
    assert statuses == expected
    assert "token" in targets[urls[5]]["error"]  # says what to do
    assert targets[urls[4]]["error"] == "no complete answer within 2 s"  # --timeout 2

    first = targets[urls[0]]
    assert first["status"] == "up" and first["error"] is None
    assert first["server"] == {"kind": "vllm", "version": "0.33.0",  # from /version
                               "version_inferred": False}
    (engine,) = first["engines"]
    # second scrape is the idle file: its values, rates between the two files' counters
    assert engine["kv"] == {"usage": 0.0, "blocks_total": 599, "blocks_used": 0.0,
                            "block_size": 16, "tokens_total": 9600, "tokens_used": 0.0,
                            "idle_floor_blocks": 0, "cpu_usage": None}
    assert engine["requests"] == {"running": 0.0, "waiting": 0.0, "swapped": None}
    window = engine["rates"]["window_s"]
    assert 0.4 < window < 3
    assert engine["rates"]["prompt_tokens_per_s"] == pytest.approx((65720 - 17016) / window,
                                                                   rel=1e-3)
    hit = engine["prefix_cache"]
    assert hit["hit_rate"] == pytest.approx((24320 - 6400) / (65720 - 17016))
    assert hit["hit_rate_scope"] == "window" and hit["unit"] == "tokens"
    assert engine["preemptions_total"] == 68
    assert engine["latency_s"]["ttft"]["scope"] == "window"

    reset = targets[urls[1]]
    assert reset["status"] == "up" and reset["restarted_at"] is not None
    (engine,) = reset["engines"]
    assert engine["restarted"] and engine["rates"]["prompt_tokens_per_s"] is None


async def test_a_server_without_version_keeps_its_inferred_version_inferred() -> None:
    # no /version route (a 404): the names say "0.7+", and every scrape is read that way
    async with FaultServer(bodies=[vllm_08_idle().encode()], version=None) as server:
        code, out, err, _ = await run_kvtop("snapshot", server.url(), "--json", "--no-gpu",
                                            "--interval", "0.2")
        assert sum(r.path.endswith("/version") for r in server.requests) == 1
    assert code == 0, err
    (target,) = json.loads(out)["targets"]
    assert target["server"] == {"kind": "vllm", "version": "0.7+", "version_inferred": True}
    (engine,) = target["engines"]
    assert (engine["kv"]["blocks_total"], engine["kv"]["idle_floor_blocks"]) == (600, 1)


async def test_token_from_env_is_sent_and_never_printed() -> None:
    async with FaultServer(mode="auth", token=TOKEN) as server:
        code, out, err, _ = await run_kvtop(
            "snapshot", server.url(), "--samples", "1", "--json", "--no-gpu",
            "--token-env", "MY_VLLM_TOKEN", env={"MY_VLLM_TOKEN": TOKEN})
        assert code == 0, out + err
        assert server.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
        url = server.url()
    assert TOKEN not in out and TOKEN not in err
    assert by_url(json.loads(out))[url]["status"] == "up"


async def test_stale_when_second_scrape_fails() -> None:
    async with FaultServer() as server:
        task = asyncio.create_task(run_kvtop("snapshot", server.url(), "--json", "--no-gpu",
                                             "--interval", "1", "--timeout", "1"))
        # first scrape served, then the server starts to hang
        await eventually(lambda: server.hits, "the first scrape", timeout_s=DEADLINE_S)
        server.mode = "hang"
        code, out, _, _ = await task
    target = json.loads(out)["targets"][0]
    assert code == 3
    assert target["status"] == "stale" and "no complete answer" in target["error"]
    assert target["engines"][0]["requests"]["running"] == 30  # last good values kept


async def test_table_output_and_bad_target_usage_error() -> None:
    async with FaultServer() as server:
        code, out, err, _ = await run_kvtop("snapshot", server.url(), "--table", "--samples",
                                            "1", "--no-gpu", env={"COLUMNS": "200"})
    assert code == 0, err
    assert "588/599" in out and "twin-llama" in out
    code, _, err, _ = await run_kvtop("snapshot", "http://[::1", "--no-gpu")
    assert code == 2 and "not a host:port or URL" in err


async def test_record_writes_every_scrape_of_every_target(tmp_path) -> None:
    from kvtop.store.recording import read_recording

    output = tmp_path / "run.jsonl.gz"
    async with FaultServer() as healthy, FaultServer(mode="error500") as broken:
        code, _, err, _ = await run_kvtop(
            "record", healthy.url(), broken.url(), "-o", str(output), "--interval", "0.3",
            "--duration", "3")
        urls = [healthy.url(), broken.url()]
    assert code == 0, err
    recording = read_recording(output)
    times = [s.t for s in recording.scrapes]
    assert max(times) - min(times) <= 3  # it stopped at its duration, on its own clock
    assert recording.header["targets"] == urls
    good = [s for s in recording.scrapes if s.target.url == urls[0]]
    bad = [s for s in recording.scrapes if s.target.url == urls[1]]
    assert len(good) >= 3 and all(s.body == fixture(LOAD).decode() for s in good)
    assert bad and all(s.failure == "down" and "500" in s.error for s in bad)


async def test_record_to_unwritable_place_is_a_clear_error(tmp_path) -> None:
    code, _, err, _ = await run_kvtop("record", "127.0.0.1:1", "-o",
                                      str(tmp_path / "missing-dir" / "r.jsonl"), "--duration", "1")
    assert code == 2 and "cannot write" in err
