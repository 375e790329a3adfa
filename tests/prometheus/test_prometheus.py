"""kvtop through a real Prometheus scraping simulated vLLM servers (one leaking with idle
gaps, two healthy, one frozen, one down): the same values as direct scraping, the same
fleet rows, the same leak verdict, and kvtop's rules firing for the leaking server only."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvtop.collect.prometheus import PrometheusSource, load_settings
from kvtop.collect.target import Target
from kvtop.ui.app import AppConfig, KvtopApp
from kvtop.view import format as fmt
from tests.fakes.fake_nvml import FakeGpuReader
from tests.prometheus.conftest import PromEnv
from tests.scenarios.app import table_rows
from tests.support.waiting import eventually

ALERT_WAIT_S = 150.0  # a deadline for "never", not how long it takes (~30 s)


async def kvtop(*args: str, timeout: float = 90) -> tuple[int, Any, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, json.loads(out) if out.strip() else None, err.decode()


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {target["name"] or target["label"]: target for target in document["targets"]}


def test_promtool_accepts_kvtop_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no 'promtool' on PATH (it comes with Debian's prometheus package)")
    config = tmp_path / "kvtop.toml"
    config.write_text("[thresholds]\nidle_leak_s = 90\nwindow_s = 3600\n"
                      "[prometheus]\nselector = '{namespace=\"prod\"}'\n")
    for extra in ([], ["--config", str(config)]):
        rules = tmp_path / "rules.yml"
        out = subprocess.run([sys.executable, "-m", "kvtop", "rules", *extra],
                             capture_output=True, text=True, check=True).stdout
        rules.write_text(out)
        checked = subprocess.run([promtool, "check", "rules", str(rules)],
                                 capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "SUCCESS: 17 rules found" in checked.stdout
    assert 'namespace=\\"prod\\"' in out and "for: 90s" in out and "[3600s:60s]" in out


async def test_snapshot_shows_what_direct_scraping_shows(prom: PromEnv) -> None:
    code, through, err = await kvtop("snapshot", "--prometheus", prom.url, "--config",
                                     str(prom.config), "--json", "--no-gpu")
    direct_urls = [prom.paused, prom.leaky, *prom.healthy, prom.old, prom.down]
    direct_code, direct, _ = await kvtop("snapshot", *direct_urls, "--json", "--no-gpu")
    assert (code, direct_code) == (3, 3), err  # the down server makes both exit 3
    via, straight = by_name(through), by_name(direct)
    assert set(via) == set(straight) == {PromEnv.instance(u) for u in direct_urls}
    down = via[PromEnv.instance(prom.down)]
    assert down["status"] == "down" and "up == 0" in down["error"]
    assert "connection refused" in down["error"]
    # the frozen server answers the same body every time: every value must agree
    (frozen,), (expected,) = (via[PromEnv.instance(prom.paused)]["engines"],
                              straight[PromEnv.instance(prom.paused)]["engines"])
    for key in ("model", "engine", "kv", "requests", "prefix_cache", "preemptions_total"):
        assert frozen[key] == expected[key], key
    assert frozen["kv"]["blocks_used"] > 0 and frozen["requests"]["running"] > 0
    # the live ones: same pools, and counters read through Prometheus (earlier) never ahead
    for url in (prom.leaky, *prom.healthy):
        (engine,), (direct_engine,) = (via[PromEnv.instance(url)]["engines"],
                                       straight[PromEnv.instance(url)]["engines"])
        assert via[PromEnv.instance(url)]["status"] == "up"
        for key in ("blocks_total", "block_size", "tokens_total", "idle_floor_blocks"):
            assert engine["kv"][key] == direct_engine["kv"][key]
        assert 0 < engine["prefix_cache"]["queries_total"] <= \
            direct_engine["prefix_cache"]["queries_total"]
    # no /version either way: the names say "0.7+", which no later read may take as exact
    old = PromEnv.instance(prom.old)
    for document in (via, straight):
        assert document[old]["server"] == {"kind": "vllm", "version": "0.7+",
                                           "version_inferred": True}
        (engine,) = document[old]["engines"]
        assert (engine["kv"]["blocks_total"], engine["kv"]["idle_floor_blocks"]) == (600, 1)


async def _rows(config: AppConfig, names: set[str]) -> tuple[dict[str, dict[str, str]],
                                                              dict[str, str]]:
    """The rows shown once the table has drawn every target's data, and each target's
    tracker status."""
    app = KvtopApp(config)
    async with app.run_test(size=(200, 40)) as pilot:

        def drawn() -> bool:
            states = {t.state.target.label: t.state for t in app.trackers.values()}
            rows = {row["name"]: row for row in table_rows(app)}
            return all(
                name in states and name in rows and states[name].status != "pending"
                and rows[name]["status"] != "…"  # the table has drawn what was folded
                and (states[name].status != "up" or rows[name]["model"] != fmt.DASH)
                for name in names)

        await eventually(drawn, f"rows with data for {sorted(names)}", pause=pilot.pause)
        statuses = {t.state.target.label: t.state.status for t in app.trackers.values()}
        return {row["name"]: row for row in table_rows(app)}, statuses


async def test_fleet_view_through_prometheus_shows_the_same_rows(prom: PromEnv) -> None:
    settings = load_settings(prom.url, selector='{job="vllm"}', backfill_step_s=1)
    source = PrometheusSource(settings, interval_s=0.5)
    targets = await source.discover()
    await source.aclose()
    names = {t.name for t in targets if t.name}
    common = {"interval_s": 0.5, "no_gpu": True, "gpu_reader": FakeGpuReader([]),
              "watch_tty": False}
    via_prometheus = AppConfig(targets=targets, source_factory=lambda _c: source, **common)
    through, through_status = await _rows(via_prometheus, names)
    direct_targets = [Target.from_spec(u) for u in (prom.paused, prom.leaky, *prom.healthy,
                                                    prom.old, prom.down)]
    direct, direct_status = await _rows(AppConfig(targets=direct_targets, **common), names)
    assert set(through) == set(direct) == names
    frozen = PromEnv.instance(prom.paused)
    for column in ("model", "kv", "running", "waiting", "status"):
        assert through[frozen][column] == direct[frozen][column], column
    assert through_status == direct_status
    assert through_status[PromEnv.instance(prom.down)] == "down"


def _firing(prom: PromEnv) -> list[dict[str, Any]]:
    alerts = httpx.get(f"{prom.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


async def _leak_alerts(prom: PromEnv) -> list[dict[str, Any]]:
    """Prometheus's firing leak alerts, once it fires one (failing after ALERT_WAIT_S)."""
    def leak_alerts() -> list[dict[str, Any]]:
        return [a for a in _firing(prom) if a["labels"]["alertname"] ==
                "KVCacheLeakIdleResidual"]

    return await eventually(leak_alerts, "the idle-residual leak alert to fire",
                            timeout_s=ALERT_WAIT_S)


async def test_prometheus_fires_the_leak_alert_for_the_leaking_server_only(
        prom: PromEnv) -> None:
    leak = await _leak_alerts(prom)
    assert {a["labels"]["instance"] for a in leak} == {PromEnv.instance(prom.leaky)}
    assert leak[0]["labels"]["severity"] == "critical"
    assert "held with nothing running" in leak[0]["annotations"]["description"]
    firing = {a["labels"]["instance"] for a in _firing(prom)
              if a["labels"]["alertname"].startswith("KVCacheLeak")}
    assert firing == {PromEnv.instance(prom.leaky)}


async def test_prometheus_fires_the_stall_alert_for_the_frozen_server(prom: PromEnv) -> None:
    # The paused server stopped mid-load: requests running, no token for good.
    stalled = await eventually(
        lambda: [a for a in _firing(prom) if a["labels"]["alertname"] == "KVEngineStalled"],
        "the stall alert to fire", timeout_s=ALERT_WAIT_S)
    instances = {a["labels"]["instance"] for a in stalled}
    assert PromEnv.instance(prom.paused) in instances
    assert not instances & {PromEnv.instance(u) for u in prom.healthy}
    assert "no token generated" in stalled[0]["annotations"]["description"]


async def test_check_through_prometheus_finds_the_leaking_server_only(prom: PromEnv) -> None:
    # Judged at once from what Prometheus stored over the last 30 min (here: since the tier
    # started), not after watching for 30 min: the 90 s limit of kvtop() would fail first.
    # The stored past must hold the leak: wait until Prometheus's own rule has seen it.
    await _leak_alerts(prom)
    code, document, err = await kvtop("check", "--prometheus", prom.url, "--config",
                                      str(prom.config), "--duration", "30m", "--json")
    assert code == 1, err
    assert 0 < document["duration_s"] <= 1800 and document["started_at"] < document["ended_at"]
    verdicts = {target["target"].rsplit("/", 1)[1]: [e["verdict"] for e in target["engines"]]
                for target in document["targets"]}
    assert verdicts.pop(PromEnv.instance(prom.leaky)) == ["leak"]
    assert verdicts and all("leak" not in v for v in verdicts.values()), verdicts
