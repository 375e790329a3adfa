"""Deterministic scenes for the UI tests: fixed clock, real /metrics bodies, made-up states."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from textual.pilot import Pilot

from kvtop.collect.adapters import read_exposition
from kvtop.collect.kv_endpoint import KvChannel, KvEventsEndpoint, RankStatus
from kvtop.collect.reading import LoraInfo
from kvtop.collect.target import Scrape, Secret, Target
from kvtop.derive.stats import EngineStats, HotPrefix, Quantiles, Residency, Reuse
from kvtop.derive.tracker import EngineKey, TargetState
from kvtop.derive.verdicts import LeakVerdict, LimitVerdict, StallVerdict
from kvtop.store.recording import RecordingWriter
from kvtop.ui.app import AppConfig, KvtopApp
from kvtop.ui.widgets.fleet_table import FleetTable
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_source import FakeSource
from tests.scenarios.gpu import DCGM_MIG, gpu_fixture
from tests.scenarios.kv_cache import kv_event_stats
from tests.support.paths import fixture_text
from tests.support.waiting import DEADLINE_S

T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
TOKEN = "sekrit-token-do-not-leak"

UNDER_LOAD = "vllm-0.33.0-v1-twin-under-load.txt"
LEAKING_IDLE = "vllm-0.10.1.1-v1-twin-leaking-idle.txt"

HOST_A = Target.from_spec("10.0.0.5:8000", token=Secret(TOKEN))
HOST_B = Target.from_spec("10.0.0.5:8001")
GATEWAY = Target.from_spec("gw.internal:9090", name="gateway")
LIVE_TARGETS = [HOST_A, HOST_B, GATEWAY]


def live_scrapes() -> list[Scrape]:
    """Real bodies: two vLLM hosts on one machine and an endpoint that isn't a server."""
    return [
        Scrape(HOST_A, T0, fixture_text(UNDER_LOAD)),
        Scrape(HOST_B, T0, fixture_text(LEAKING_IDLE)),
        Scrape(GATEWAY, T0, "# TYPE http_requests_total counter\nhttp_requests_total 7\n"),
    ]


def live_app(
    tmp_path: Path, *, clock_at: float = T0 + 2, **config: object
) -> tuple[KvtopApp, FakeSource]:
    """The app over real trackers fed by a hand-driven source; the clock is fixed."""
    source = FakeSource(live_scrapes())
    defaults: dict[str, object] = {
        "targets": LIVE_TARGETS,
        "source_factory": lambda cfg: source,
        "gpu_reader": FakeGpuReader(),
        "clock": lambda: clock_at,
        "snapshot_dir": tmp_path,
    }
    app = KvtopApp(AppConfig(**(defaults | config)))  # type: ignore[arg-type]
    return app, source


async def until(pilot: Pilot, ready: Callable[[], object],
                timeout_s: float = DEADLINE_S) -> bool:
    """Whether ``ready()`` turns true within ``timeout_s``, checked between short pauses.
    A loaded CI machine takes its time to fold a scrape, push a screen or lay out a table:
    a fixed pause there makes a flaky test. A check that raises (no screen yet) is not ready;
    an app that crashed is never ready (a planted bug's crash fails at once, not in a minute).
    (tests.waiting.eventually does the same and fails itself, saying what it waited for.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return True
        except Exception:  # mid-transition, e.g. no screen on the stack yet
            pass
        if time.monotonic() > deadline or pilot.app._exception is not None:  # crashed
            return False
        await pilot.pause(0.05)


async def screen_shows(pilot: Pilot, text: str, timeout_s: float = DEADLINE_S) -> bool:
    """Whether the painted screen shows ``text`` within ``timeout_s``."""
    return await until(
        pilot, lambda: text in pilot.app.export_screenshot().replace("&#160;", " "), timeout_s
    )


async def live_data_shown(pilot: Pilot, timeout_s: float = DEADLINE_S) -> bool:
    """The live scene's first scrapes are folded and drawn: every host's row has a status."""
    app = pilot.app
    assert isinstance(app, KvtopApp)

    def drawn() -> bool:
        statuses = {r["name"]: r["status"] for r in table_rows(app)}
        return (statuses.get("10.0.0.5:8000") == "up" and len(statuses) == len(LIVE_TARGETS)
                and "…" not in statuses.values())

    return await until(pilot, drawn, timeout_s)


def write_recording(path: Path, seconds: int = 300) -> Path:
    """A recording of two hosts every 5 s: one loaded, one idle with 828 of 1000 blocks held
    (a leak: the detector says LEAK after a minute of it)."""
    loaded, idle = fixture_text(UNDER_LOAD), fixture_text(LEAKING_IDLE)
    with RecordingWriter(path, interval_s=5.0, targets=[HOST_A, HOST_B]) as writer:
        for t in range(0, seconds, 5):
            writer.write(Scrape(HOST_A, T0 + t, loaded))
            writer.write(Scrape(HOST_B, T0 + t, idle))
    return path


def table_rows(app: KvtopApp) -> list[dict[str, str]]:
    """Each row shown, in order, as column key -> cell text."""
    table = app.query_one(FleetTable)
    return [{c.key: row.cells[c.key].text for c in table.columns} for row in table.rows]


# --- made-up states for the SVG snapshots: no parsing involved, so only the UI can change them


class StaticTracker:
    """A tracker with a fixed state and history (the app never receives a scrape)."""

    def __init__(self, state: TargetState, history: dict[EngineKey, deque[EngineStats]]):
        self.state = state
        self.history = history

    def update(self, scrape: Scrape) -> TargetState:
        return self.state


def _stats(model: str, t: float, phase: float, blocks_total: int) -> EngineStats:
    used = blocks_total * (0.55 + 0.35 * math.sin(phase))
    running = 24 + 10 * math.sin(phase)
    waiting = max(0.0, 12 * math.sin(phase - 0.6))
    return EngineStats(
        model=model, engine="0", t=t, kv_usage=used / blocks_total, blocks_total=blocks_total,
        blocks_used=round(used), block_size=16, tokens_total=blocks_total * 16,
        running=round(running), waiting=round(waiting), hit_rate=0.42 + 0.2 * math.cos(phase),
        hit_rate_scope="window", prompt_tps=1800 + 400 * math.sin(phase),
        generation_tps=950 + 150 * math.cos(phase), preemptions_per_s=0.0 if waiting < 8 else 0.5,
        prefix_queries_total=1e6, prefix_hits_total=3.8e5, prefix_queries_per_s=2000.0,
        ttft=Quantiles(0.08 + 0.05 * math.sin(phase), None, 0.9 + 0.3 * math.sin(phase), 40),
        itl=Quantiles(0.021, None, 0.05, 900), window_s=5.0,
        limit=LimitVerdict("kv_capacity", f"{round(waiting)} wait for capacity, pool "
                           f"{used / blocks_total:.0%} used") if round(waiting) else NOTHING_WAITS,
        waiting_by_reason={"capacity": float(round(waiting)), "deferred": 0.0},
        reuse=Reuse("window", 9000.0, {"local_cache_hit": 0.38, "local_compute": 0.62},
                    {"device": 0.31, "host": 0.07}, 0.38, None),
        residency=Residency("on", Quantiles(41.0, 190.0, 420.0, 300),
                            Quantiles(12.0, 60.0, 170.0, 300), Quantiles(3.0, 20.0, 55.0, 900)),
        kv_events=kv_event_stats(stored_per_s=180 + 60 * math.sin(phase),
                                 removed_per_s=175 + 60 * math.sin(phase - 0.3),
                                 population=round(used), pool_blocks=blocks_total - 1,
                                 turnovers=2.1 + phase / 3, leak="none",
                                 hot=(HotPrefix(0x8107D90E7954426B, 2048, 312),)),
    )


NOTHING_WAITS = LimitVerdict("none", "nothing waits", {"waiting": 0.0})


LEAKING = LeakVerdict(
    "leak", "idle floor rose 2100 blocks in 30m beyond what the load explains", 2140.0,
    4200.0, 4.3, {"used": 12000.0, "pool": 20184.0, "idle_residual": 2140.0,
                  "floor_slope_per_h": 4200.0, "consequences": "queue growing"},
)
QUIET = LeakVerdict("ok", "pool drained to its idle floor: nothing leaked so far", 0.0, None,
                    None, {"used": 0.0, "pool": 20184.0})
WARMING = LeakVerdict("warmup", "8000 blocks held with nothing running: confirming they are "
                      "not in flight (8 s)", None, None, None)
WEDGED = StallVerdict("stalled", "KV pool 100% full with 33 requests waiting: no token "
                      "generated for 8 s (0 running)", T0 + 292,
                      {"running": 0.0, "waiting": 33.0, "kv_usage": 1.0})
CACHE_CONFIG = {"block_size": "16", "num_gpu_blocks": "20184", "enable_prefix_caching": "True",
                "cache_dtype": "auto", "gpu_memory_utilization": "0.9"}


def static_trackers() -> dict[str, StaticTracker]:
    """Seven targets: loaded (its KV events subscribed, with exact leak evidence), idle,
    down, stale, not an inference server, the dcgm-exporter on the host of the first two
    (so they own its GPUs), and one wedged (STALLED, its leak detector still warming up,
    held by KV capacity); 5 min of history."""
    loaded = Target.from_spec("10.0.0.5:8000", name="llama-70b-a")
    second = Target.from_spec("10.0.0.5:8001", name="llama-70b-b")
    down = Target.from_spec("10.0.0.6:8000")
    stale = Target.from_spec("10.0.0.7:30000", name="sglang-qwen")
    other = Target.from_spec("gw.internal:9090", name="gateway")
    exporter = Target.from_spec("10.0.0.5:9400", name="ub20-a100-k8s")
    wedged = Target.from_spec("10.0.0.8:8000", name="vllm-wedged")  # sorts last
    now = T0 + 300
    history = deque(_stats("meta-llama/Llama-3.3-70B", T0 + i * 5, i / 9, 20184) for i in range(61))
    history[-1].leak = LEAKING
    history[-1].cache_config = CACHE_CONFIG
    history[-1].prefix_caching = True
    history[-1].lora = LoraInfo(4, ("sql-lora", "chat-lora"), ("summarise-lora",))
    history[-1].kv_events = replace(  # blocks a request holds and never uses again
        history[-1].kv_events, leak="evidence", leaked_blocks=2140, turnovers=5.9,
        leak_reason="2,140 blocks unused for 3+ turnovers of the pool (the oldest 5.9)",
        leaked_sample=(0x00C0FFEE5EED0001, 0x00C0FFEE5EED0002))
    trackers = {
        loaded.url: StaticTracker(
            TargetState(loaded, "up", kind="vllm", version="0.33.0", engines=[history[-1]],
                        last_attempt_t=now, last_good_t=now,
                        kv_channel=KvChannel(KvEventsEndpoint("tcp://10.0.0.5:5557"),
                                             [RankStatus(0, "connected", batches=4100)])),
            {("meta-llama/Llama-3.3-70B", "0"): history},
        ),
        second.url: StaticTracker(
            TargetState(second, "up", kind="vllm", version="0.33.0",
                        engines=[EngineStats("meta-llama/Llama-3.3-70B", "0", now, kv_usage=0.0,
                                             blocks_total=20184, blocks_used=0, running=0,
                                             waiting=0, hit_rate=None, prompt_tps=0,
                                             generation_tps=0, preemptions_per_s=0,
                                             leak=QUIET, limit=NOTHING_WAITS)],
                        last_attempt_t=now, last_good_t=now, restarted_at=now - 40),
            {},
        ),
        down.url: StaticTracker(
            TargetState(down, "down", error="connection refused", last_attempt_t=now,
                        last_good_t=now - 125),
            {},
        ),
        stale.url: StaticTracker(
            TargetState(stale, "stale", kind="sglang", error="timed out after 5s",
                        failure="timeout",
                        engines=[EngineStats("Qwen/Qwen2.5-7B", None, now - 12, kv_usage=0.31,
                                             running=7, waiting=0, tokens_total=400000,
                                             generation_tps=310.0)],
                        last_attempt_t=now, last_good_t=now - 12),
            {},
        ),
        other.url: StaticTracker(
            TargetState(other, "up", kind="unknown", last_attempt_t=now, last_good_t=now),
            {},
        ),
        exporter.url: StaticTracker(
            TargetState(exporter, "up", kind="dcgm", last_attempt_t=now, last_good_t=now,
                        gpus=read_exposition(gpu_fixture(DCGM_MIG)).gpus),
            {},
        ),
        wedged.url: StaticTracker(
            TargetState(wedged, "up", kind="vllm", version="0.33.0",
                        engines=[EngineStats("mistralai/Mistral-7B-v0.3", "0", now,
                                             kv_usage=1.0, blocks_total=8000, blocks_used=8000,
                                             running=0, waiting=33, prompt_tps=0,
                                             generation_tps=0, preemptions_per_s=0,
                                             leak=WARMING, stall=WEDGED,
                                             limit=LimitVerdict(
                                                 "kv_capacity",
                                                 "33 wait for capacity, pool 100% used"))],
                        last_attempt_t=now, last_good_t=now),
            {},
        ),
    }
    return trackers


def static_app(**config: object) -> KvtopApp:
    trackers = static_trackers()
    defaults: dict[str, object] = {
        "targets": [t.state.target for t in trackers.values()],
        "source_factory": lambda cfg: FakeSource(),
        "tracker_factory": lambda target: trackers[target.url],
        "gpu_reader": FakeGpuReader(),
        "clock": lambda: T0 + 300,
    }
    return KvtopApp(AppConfig(**(defaults | config)))  # type: ignore[arg-type]
