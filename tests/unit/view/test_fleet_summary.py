"""The header's numbers: KV weighed by capacity, hosts up, verdict counts, hit rate."""

from __future__ import annotations

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict, StallState, StallVerdict
from kvtop.view.fleet import build_rows, filter_rows, order_rows
from kvtop.view.fleet_summary import FleetSummary, summarise
from tests.scenarios.app import LEAKING, QUIET

NOW = 1000.0


def _up(spec: str, *engines: EngineStats) -> TargetState:
    return TargetState(Target.from_spec(spec), "up", kind="vllm", engines=list(engines),
                       last_good_t=NOW)


def test_summary_weights_kv_by_capacity() -> None:
    big = EngineStats("m", None, NOW, kv_usage=0.5, blocks_total=1000, blocks_used=500, running=3)
    small = EngineStats("m", None, NOW, kv_usage=1.0, blocks_total=100, blocks_used=100, waiting=4)
    down = TargetState(Target.from_spec("h:3"), "down")
    summary = summarise([_up("h:1", big), _up("h:2", small), down])
    assert (summary.hosts_up, summary.hosts_total) == (2, 3)
    assert summary.kv_usage == 600 / 1100
    assert (summary.running, summary.waiting) == (3, 4)


def test_the_summary_counts_inference_servers_and_weighs_the_hit_rate() -> None:
    busy = EngineStats("m", None, NOW, hit_rate=0.9, hit_rate_scope="window",
                       prefix_queries_per_s=900.0, generation_tps=100.0)
    quiet = EngineStats("m", None, NOW, hit_rate=0.0, hit_rate_scope="window",
                        prefix_queries_per_s=100.0, generation_tps=50.0)
    gateway = TargetState(Target.from_spec("gw:1"), "up", kind="unknown", last_good_t=NOW)
    exporter = TargetState(Target.from_spec("gpu:9400"), "up", kind="dcgm", last_good_t=NOW)
    rows = build_rows([_up("a:1", busy), _up("b:1", quiet), gateway, exporter], NOW)
    summary = summarise(rows)
    assert (summary.hosts_up, summary.hosts_total) == (2, 3)  # not the gateway, nor a GPU
    assert summary.hit_rate == 0.81  # 810 hits of 1000 lookups, not the mean of 90 % and 0 %
    assert summary.generation_tps == 150.0
    assert summarise(filter_rows(rows, "a:1")).hosts_total == 1  # the header follows a filter


WARMUP = LeakVerdict("warmup", "collecting data", None, None, None)
WATCHING = LeakVerdict("watch", "floor rising", 80.0, 1234.0, 9.0)


def _state(spec: str, verdict: LeakVerdict | None) -> TargetState:
    stats = EngineStats("m", None, NOW, blocks_used=10, blocks_total=100, leak=verdict)
    return TargetState(Target.from_spec(spec), "up", kind="vllm", engines=[stats],
                       last_good_t=NOW)


def test_summary_counts_and_sort_puts_leaks_first() -> None:
    states = [_state("a:1", QUIET), _state("b:1", LEAKING), _state("c:1", WATCHING),
              _state("d:1", WARMUP)]
    summary = summarise(states)
    assert (summary.leaks, summary.watches, summary.judged) == (1, 1, 3)
    names = [r.name for r in order_rows(build_rows(states, NOW), "leak")]
    assert names[:2] == ["b:1", "c:1"]


def test_the_header_counts_the_engines_each_limit_holds_back() -> None:
    from kvtop.derive.verdicts import LimitVerdict

    def held(limit: str) -> EngineStats:
        return EngineStats("m", None, NOW, limit=LimitVerdict(limit, "why"))  # type: ignore[arg-type]

    down = TargetState(Target.from_spec("h:9"), "down", engines=[held("kv_capacity")])
    summary = summarise([_up("h:1", held("kv_capacity"), held("none")),
                         _up("h:2", held("max_sequences"), held("kv_capacity")), down])
    assert summary.limits == (("KV", 2), ("seqs", 1))  # a down server's last values: not


def test_a_server_that_stopped_answering_leaves_the_fleet_s_sums_at_once() -> None:
    # its last numbers stay in its own dimmed row, never in the header for a minute more
    stats = EngineStats("m", None, NOW - 3, blocks_used=80, blocks_total=100, running=7,
                        waiting=2, generation_tps=500.0, leak=LEAKING)
    live = EngineStats("m", None, NOW, blocks_used=10, blocks_total=100, running=1)
    stale = TargetState(Target.from_spec("s:1"), "stale", failure="timeout", kind="vllm",
                        engines=[stats], last_good_t=NOW - 3)
    for rows in ([_up("a:1", live), stale], build_rows([_up("a:1", live), stale], NOW)):
        summary = summarise(rows)
        assert (summary.hosts_up, summary.hosts_total) == (1, 2)
        assert (summary.blocks_used, summary.blocks_total) == (10, 100)
        assert (summary.running, summary.waiting, summary.leaks) == (1, 0, 0)
        assert summary.generation_tps is None


def test_an_empty_fleet_has_no_pool_and_counts_nothing() -> None:
    assert summarise([]) == FleetSummary(hosts_up=0, hosts_total=0, blocks_used=None,
                                          blocks_total=None, running=0.0, waiting=0.0)
    assert summarise([]).kv_usage is None


def test_the_pool_sums_blocks_where_known_and_usage_times_pool_where_not() -> None:
    # a rounded usage figure next to block counts: the blocks win (1 of 3, not 0.9999)
    rounded = EngineStats("m", None, NOW, kv_usage=0.3333, blocks_used=1, blocks_total=3,
                          running=2, waiting=4, prompt_tps=1000.0, generation_tps=80.0)
    # a usage and a pool but no used count: a quarter of 400 blocks
    usage_only = EngineStats("m", None, NOW, kv_usage=0.25, blocks_total=400, waiting=2,
                             prompt_tps=250.5, hit_rate=0.5, hit_rate_scope="window",
                             prefix_queries_per_s=200.0)
    # a usage without a pool (llama.cpp) and a pool without a usage add no blocks; a hit
    # rate since start, or one with no lookups, adds nothing to the window's hit rate
    no_pool = EngineStats("m", None, NOW, kv_usage=0.5, running=1, hit_rate=0.1,
                          hit_rate_scope="lifetime", prefix_queries_per_s=50.0)
    no_usage = EngineStats("m", None, NOW, blocks_total=100, hit_rate=0.9,
                           hit_rate_scope="window")
    summary = summarise([_up("a:1", rounded, usage_only), _up("b:1", no_pool, no_usage)])
    assert summary == FleetSummary(hosts_up=2, hosts_total=2, blocks_used=101.0,
                                   blocks_total=403, running=3.0, waiting=6.0, hit_rate=0.5,
                                   prompt_tps=1250.5, generation_tps=80.0)
    assert summary.kv_usage == 101 / 403


def _stalled(spec: str, *states: StallState | None) -> TargetState:
    return _up(spec, *(EngineStats("m", None, NOW, stall=None if state is None else
                                   StallVerdict(state, "why", None)) for state in states))


def test_the_header_counts_stalled_and_saturated_engines_apart() -> None:
    summary = summarise([_stalled("a:1", "stalled", "ok", "saturated"),
                         _stalled("b:1", "stalled", "unknown", None)])
    assert (summary.stalls, summary.saturated) == (2, 1)
    calm = summarise([_stalled("a:1", "ok", None)])
    assert (calm.stalls, calm.saturated) == (0, 0)
