"""`kvtop compare` on the simulated server: a healthy baseline against runs with one thing
changed flags the figures that change explains as worse (and lists a config change first);
against 20 reruns of the same server with other seeds it flags nothing.

Runs are recordings made in simulated time (tests/scenarios/baseline_runs.py) and summarised as
`kvtop baseline save --from` and `kvtop compare --replay` summarise them; the last tests
run those commands on the same files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvtop.baseline.compare import Comparison, compare
from kvtop.cli import main
from kvtop.collect.source import read_scrape
from tests.scenarios.baseline_runs import CHANGED_SEED, RERUNS, Recordings, summarise


def verdicts(result: Comparison) -> dict[str, str]:
    (engine,) = result.engines
    out = {f.spec.key: f.verdict for f in engine.figures}
    out["leak"] = engine.leak_verdict
    return out


def flagged(result: Comparison, verdict: str) -> set[str]:
    return {key for key, value in verdicts(result).items() if value == verdict}


@pytest.fixture(scope="module")
def healthy(recordings: Recordings) -> Any:
    return summarise(recordings.path("healthy"), "healthy")


def test_a_leak_flags_the_leak_detector(recordings: Recordings, healthy: Any) -> None:
    result = compare(healthy, summarise(recordings.path("leak")))
    assert result.verdict == "worse" and result.exit_code() == 1
    assert "leak" in flagged(result, "worse")
    (engine,) = result.engines
    assert (engine.leak_baseline, engine.leak_now) == ("ok", "leak")
    kv = next(f for f in engine.figures if f.spec.key == "kv_usage")
    assert kv.now is not None and kv.baseline is not None and kv.now > kv.baseline
    assert result.all_config_changes() == []


def test_a_leak_raises_the_idle_floor(recordings: Recordings) -> None:
    """Bursts with idle gaps: a healthy server's pool empties at every gap (its idle floor is
    0, the same every time); a leaking one keeps more blocks at each gap."""
    from benchmarks.baseline_eval.scenarios import HEALTHY

    bursty = HEALTHY.but(arrival="bursty")
    base = summarise(recordings.path("bursty", bursty))
    floor = base.targets[0].engines[0].figure("idle_kv_usage")
    assert floor.value == 0.0 and len(floor.values) >= 10 and floor.summary["samples"]
    leak = compare(base, summarise(recordings.path("bursty-leak", bursty.but(
        seed=CHANGED_SEED, leak_frac=0.01))))
    assert {"idle_kv_usage", "leak"} <= flagged(leak, "worse")
    rerun = compare(base, summarise(recordings.path("bursty-rerun", bursty.but(
        seed=CHANGED_SEED))))
    assert verdicts(rerun)["idle_kv_usage"] == "same" and rerun.verdict == "same"


def test_fewer_blocks_is_the_config_change_and_fuller_pool(recordings: Recordings,
                                                           healthy: Any) -> None:
    result = compare(healthy, summarise(recordings.path("fewer_blocks")))
    doc = result.to_json()
    assert [(c["key"], c["baseline"], c["now"]) for c in doc["config_changes"]] == [
        ("num_gpu_blocks", 600, 420)]
    assert "kv_usage" in flagged(result, "worse")
    # the same load: tokens/s not flagged (unknown at 20 minutes: too little power for 10 %)
    assert {verdicts(result)["prompt_tps"], verdicts(result)["generation_tps"]} <= {
        "same", "unknown"}
    assert result.engines[0].load is not None and result.engines[0].load.verdict not in (
        "higher", "lower")
    assert result.exit_code() == 1


def test_prefix_caching_off_on_a_prefix_heavy_workload(recordings: Recordings) -> None:
    base = summarise(recordings.path("prefix_heavy"), "prefix-heavy")
    result = compare(base, summarise(recordings.path("prefix_caching_off")))
    changes = result.all_config_changes()
    assert [(c["key"], c["baseline"], c["now"]) for c in changes] == [
        ("prefix_caching", True, False)]
    (engine,) = result.engines
    hit_rate = next(f for f in engine.figures if f.spec.key == "hit_rate")
    assert hit_rate.baseline is not None and hit_rate.baseline > 0.5
    assert hit_rate.now == 0.0  # the server says it reuses nothing: 0, not unknown
    assert {"hit_rate", "ttft_p99", "kv_usage"} <= flagged(result, "worse")


def test_double_the_arrival_rate_is_a_load_change_not_a_regression(
        recordings: Recordings, healthy: Any) -> None:
    """Twice the tokens: the load rose, and the fuller pool, the queue and the slower
    answers follow it; no minute of the two runs saw the same load, so they are higher,
    never worse."""
    result = compare(healthy, summarise(recordings.path("double_rate")))
    (engine,) = result.engines
    assert engine.load is not None and engine.load.verdict == "higher"
    assert engine.load_range is None  # no minute of one run at the other's load
    assert {"prompt_tps", "generation_tps", "running"} <= flagged(result, "higher")
    assert {"kv_usage", "waiting", "ttft_p99"} <= flagged(result, "higher")
    assert not flagged(result, "worse") and result.exit_code() == 0
    kv = next(f for f in engine.figures if f.spec.key == "kv_usage")
    assert kv.note is not None and kv.note.startswith("follows the load (1.01 -> 1.94 "
                                                      "arrivals/s)")
    assert result.all_config_changes() == []


def test_reruns_with_other_seeds_flag_nothing(recordings: Recordings, healthy: Any) -> None:
    flags = {}
    for seed in range(1, RERUNS + 1):
        result = compare(healthy, summarise(recordings.rerun(seed)))
        assert result.engines[0].config_changes == []
        flags[seed] = {k: v for k, v in verdicts(result).items()
                       if v not in ("same", "unknown")}
    assert not any("worse" in found.values() for found in flags.values()), flags
    # nor better, higher or lower: the same server under the same load is the same
    assert sum(len(found) for found in flags.values()) == 0, flags


def test_missing_figures_stay_unknown_on_sglang(recordings: Recordings) -> None:
    """SGLang exports no preemptions, pool size in blocks or block size: the baseline keeps
    them unknown (null), compare says so, and they never count as 0."""
    from benchmarks.baseline_eval.scenarios import HEALTHY

    base = summarise(recordings.path("sglang", HEALTHY.but(names="sglang")))
    rerun = summarise(recordings.path("sglang-2", HEALTHY.but(names="sglang", seed=2)))
    (target,) = base.targets
    (engine,) = target.engines
    assert target.kind == "sglang"
    assert engine.figure("preemptions_per_min").value is None
    assert engine.config["num_gpu_blocks"] is None and engine.config["kv_tokens_total"]
    doc = base.to_json()["targets"][0]["engines"][0]
    assert doc["figures"]["preemptions_per_min"]["value"] is None
    assert doc["config"]["block_size"] is None
    result = compare(base, rerun)
    (compared,) = result.engines
    preemptions = next(f for f in compared.figures if f.spec.key == "preemptions_per_min")
    assert preemptions.verdict == "unknown" and "not known" in (preemptions.note or "")
    assert result.verdict == "same" and result.exit_code() == 0


def test_llama_cpp_carries_what_it_exports() -> None:
    """llama.cpp exports requests and token counters but no KV occupancy and no latency
    histograms: the baseline has the rates and leaves the rest unknown, never 0."""
    from kvtop.baseline.collect import summarise as summarise_scrapes
    from kvtop.collect.target import Scrape, Target

    target = Target(url="http://llama:8080/metrics")
    bodies = [read_scrape(Scrape(target, 1_767_225_600.0 + 10 * i, body=(
        f"llamacpp:prompt_tokens_total {1000 * i}\nllamacpp:tokens_predicted_total {200 * i}\n"
        f"llamacpp:requests_processing {i % 3}\nllamacpp:requests_deferred 0\n")))
        for i in range(60)]
    run = summarise_scrapes(bodies, name="llama", source={"kind": "recording"},
                            interval_s=10.0)
    (target_summary,) = run.targets
    (engine,) = target_summary.engines
    assert target_summary.kind == "llamacpp"
    assert engine.figure("prompt_tps").value == pytest.approx(100.0)
    assert len(engine.figure("prompt_tps").values) == 10  # the first minute has 50 s
    for key in ("kv_usage", "ttft_p99", "preemptions_per_min", "hit_rate"):
        assert engine.figure(key).value is None and engine.figure(key).values == ()
    result = compare(run, run)
    kv = next(f for f in result.engines[0].figures if f.spec.key == "kv_usage")
    assert kv.verdict == "unknown" and result.verdict == "same"


# -- the same through the commands ----------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip().startswith("{") else out), err


def test_commands_on_recordings(recordings: Recordings, data_home: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "baseline", "save", "healthy", "--from",
                         str(recordings.path("healthy")))
    assert code == 0, err
    assert (data_home / "healthy.json").is_file() and "saved baseline 'healthy'" in out
    code, doc, err = run(capsys, "compare", "healthy", "--replay",
                         str(recordings.path("fewer_blocks")), "--json")
    assert code == 1, err
    assert doc["kvtop_compare"] == 1 and doc["verdict"] == "worse" and doc["regression"]
    assert doc["config_changes"][0]["key"] == "num_gpu_blocks"
    figures = {f["figure"]: f for f in doc["engines"][0]["figures"]}
    assert figures["kv_usage"]["verdict"] == "worse"
    assert figures["kv_usage"]["now"] > figures["kv_usage"]["baseline"]
    code, doc, err = run(capsys, "compare", "healthy", "--replay", str(recordings.rerun(1)),
                         "--json")
    assert code == 0 and doc["verdict"] == "same", err
    # another baseline as the run: save the smaller pool, compare the two baselines
    run(capsys, "baseline", "save", "smaller", "--from", str(recordings.path("fewer_blocks")))
    code, doc, err = run(capsys, "compare", "healthy", "smaller", "--json")
    assert code == 1 and doc["now"]["name"] == "smaller", err


def test_text_output_names_the_change_first(recordings: Recordings, data_home: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from kvtop.baseline.text import render_comparison

    base = summarise(recordings.path("healthy"), "healthy")
    text = render_comparison(compare(base, summarise(recordings.path("fewer_blocks")))
                             .to_json())
    lines = text.splitlines()
    change = next(i for i, line in enumerate(lines) if "num_gpu_blocks" in line)
    kv_row = next(i for i, line in enumerate(lines) if line.strip().startswith("KV usage"))
    assert lines[0] == "kvtop compare: WORSE"
    assert change < kv_row and "600 -> 420" in lines[change]
    assert lines[kv_row].endswith("WORSE")


@pytest.mark.parametrize(("change", "baseline", "worse"), [
    ("leak", "healthy", {"leak"}),
    ("fewer_blocks", "healthy", {"kv_usage"}),
    ("prefix_caching_off", "prefix_heavy", {"hit_rate", "ttft_p99", "kv_usage"}),
])
def test_each_change_through_compare_replay(recordings: Recordings, data_home: Path,
                                            capsys: pytest.CaptureFixture[str], change: str,
                                            baseline: str, worse: set[str]) -> None:
    """`kvtop baseline save --from` and `kvtop compare --replay` (recordings streamed from
    disk) flag what the in-process comparison flags, and exit 1."""
    code, _, err = run(capsys, "baseline", "save", baseline, "--from",
                       str(recordings.path(baseline)))
    assert code == 0, err
    code, doc, err = run(capsys, "compare", baseline, "--replay",
                         str(recordings.path(change)), "--json")
    assert code == 1 and doc["verdict"] == "worse", err
    (engine,) = doc["engines"]
    flagged_worse = {f["figure"] for f in engine["figures"] if f["verdict"] == "worse"}
    if engine["leak"]["verdict"] == "worse":
        flagged_worse.add("leak")
    assert worse <= flagged_worse, flagged_worse
    expected = compare(summarise(recordings.path(baseline), baseline),
                       summarise(recordings.path(change)))
    assert flagged_worse == flagged(expected, "worse")


def test_reruns_through_compare_replay_flag_nothing(recordings: Recordings, data_home: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "baseline", "save", "healthy", "--from",
               str(recordings.path("healthy")))[0] == 0
    verdicts_seen = {}
    for seed in range(1, RERUNS + 1):
        code, doc, err = run(capsys, "compare", "healthy", "--replay",
                             str(recordings.rerun(seed)), "--json")
        assert code == 0, err
        verdicts_seen[seed] = doc["verdict"]
    assert set(verdicts_seen.values()) == {"same"}, verdicts_seen


# -- the load, and the power to say SAME -----------------------------------------------------


def part(path: Path, since: float | None = None, until: float | None = None) -> Any:
    """Minutes of a recording (offsets in seconds from its first scrape), summarised."""
    from kvtop.baseline import collect
    from kvtop.store.recording import read_recording
    from kvtop.store.time_range import Bound, TimeRange

    recording = read_recording(path)
    span = TimeRange(None if since is None else Bound(since, True),
                     None if until is None else Bound(until, True))
    return collect.summarise(span.within(recording.in_time_order()),
                             targets=recording.targets(), name=None, source={},
                             interval_s=recording.interval_s, in_time_order=True)


def test_the_halves_of_a_load_ramp_are_a_load_change_not_a_regression(
        recordings: Recordings) -> None:
    """40 minutes of a rate rising from 1/s to 3/s: the second half against the first is
    busier, its queue and latency follow the load, and nothing is worse."""
    from benchmarks.baseline_eval.scenarios import HEALTHY

    ramp = recordings.path("ramp", HEALTHY.but(ramp_to=3.0, minutes=40))
    result = compare(part(ramp, until=1200), part(ramp, since=1200))
    (engine,) = result.engines
    assert engine.load is not None and engine.load.verdict == "higher"
    assert engine.load.spec.key == "arrivals_per_s"
    assert not flagged(result, "worse") and result.exit_code() == 0
    assert {"waiting", "ttft_p99"} <= flagged(result, "higher")
    waiting = next(f for f in engine.figures if f.spec.key == "waiting")
    assert waiting.note is not None and waiting.note.startswith("follows the load")


def test_a_busier_healthy_server_is_no_regression_and_a_leak_at_its_load_is(
        recordings: Recordings) -> None:
    from benchmarks.baseline_eval.scenarios import HEALTHY

    base = summarise(recordings.path("healthy-40", HEALTHY.but(minutes=40)))
    busier = compare(base, summarise(recordings.path("busier-40", HEALTHY.but(
        rate=1.5, seed=CHANGED_SEED, minutes=40))))
    assert busier.engines[0].load is not None
    assert busier.engines[0].load.verdict == "higher"
    assert not flagged(busier, "worse") and busier.exit_code() == 0
    assert {"kv_usage", "ttft_p99"} <= flagged(busier, "higher")
    leak = compare(base, summarise(recordings.path("leak-40", HEALTHY.but(
        leak_frac=0.01, seed=CHANGED_SEED, minutes=40))))
    assert leak.engines[0].load is not None
    assert leak.engines[0].load.verdict not in ("higher", "lower")  # the same load offered
    assert "leak" in flagged(leak, "worse") and leak.exit_code() == 1


def test_three_minute_runs_are_unknown_where_they_cannot_judge(recordings: Recordings) -> None:
    """3 minutes a side: the rank test can never reach p < 0.01 (2 / C(6, 3) = 0.1), so
    no figure is SAME; each says what it would need, and the run exits 3."""
    from benchmarks.baseline_eval.scenarios import HEALTHY

    short = summarise(recordings.path("short", HEALTHY.but(minutes=3)))
    other = summarise(recordings.path("short-2", HEALTHY.but(minutes=3, seed=5)))
    result = compare(short, other)
    (engine,) = result.engines
    judged = [f for f in engine.figures if f.matters is not None]
    assert judged and all(f.verdict == "unknown" for f in judged)
    assert all("can never reach the rank test's p < 0.01" in (f.note or "") for f in judged)
    assert all((f.minutes_needed or f.minutes_each or 0) > 0 for f in judged)
    assert result.verdict == "unknown" and result.exit_code() == 3
    rerun = compare(summarise(recordings.path("healthy-40", HEALTHY.but(minutes=40))),
                    summarise(recordings.path("rerun-40", HEALTHY.but(minutes=40, seed=3))))
    same = flagged(rerun, "same")
    assert same and all(f.detectable is not None and f.matters is not None
                        and f.detectable <= f.matters
                        for f in rerun.engines[0].figures if f.spec.key in same)
    assert rerun.verdict == "same"


# -- the rules, on made-up values ------------------------------------------------------------


@pytest.mark.parametrize(("verdicts_seen", "overall_verdict"), [
    (["better", "worse", "same"], "worse"),  # worse outranks better: a regression exits 1
    (["worse", "better"], "worse"),
    (["better", "same", "unknown"], "better"),
    (["same", "unknown", "higher"], "same"),
    (["unknown", "unknown"], "unknown"),
    ([], "unknown"),
])
def test_the_overall_verdict(verdicts_seen: list[str], overall_verdict: str) -> None:
    from kvtop.baseline.compare import overall

    assert overall(verdicts_seen) == overall_verdict  # type: ignore[arg-type]


@pytest.mark.parametrize(("baseline", "now", "verdict"), [
    ("ok", "leak", "worse"), ("watch", "leak", "worse"), ("unknown", "leak", "worse"),
    ("ok", "watch", "same"),  # WATCH is not a leak
    ("leak", "ok", "better"), ("leak", "watch", "better"), ("leak", "leak", "same"),
    ("ok", "unknown", "unknown"), ("unknown", "ok", "unknown"), ("ok", "ok", "same"),
])
def test_the_leak_row(baseline: str, now: str, verdict: str) -> None:
    from kvtop.baseline.compare import EngineComparison

    row = EngineComparison("t", "t", "m", "0", [], [], baseline, now, "")
    assert row.leak_verdict == verdict


def test_a_setting_unknown_on_one_side_is_not_a_change() -> None:
    from kvtop.baseline.compare import config_changes

    base = {"num_gpu_blocks": 600, "block_size": 16, "cache_dtype": None,
            "prefix_caching": True, "blocks_total": 599}
    now = {"num_gpu_blocks": 600, "block_size": None, "cache_dtype": "fp8",
           "prefix_caching": False, "blocks_total": 598}
    assert [(c.key, c.baseline, c.now) for c in config_changes(base, now)] == [
        ("blocks_total", 599, 598), ("prefix_caching", True, False)]
    resized = {**now, "num_gpu_blocks": 400}
    assert [c.key for c in config_changes(base, resized)] == ["num_gpu_blocks",
                                                              "prefix_caching"]


def test_an_inferred_version_is_no_change_against_an_exact_one() -> None:
    from kvtop.baseline.compare import _versions
    from kvtop.baseline.model import TargetSummary

    exact = TargetSummary("t", "vllm", "0.33.0")
    guessed = TargetSummary("t", "vllm", "0.10.2+", version_inferred=True)
    older = TargetSummary("t", "vllm", "0.7+", version_inferred=True)
    assert _versions(exact, guessed) == (None, None)
    assert _versions(guessed, older) == ("0.10.2+ (inferred)", "0.7+ (inferred)")
    assert _versions(exact, TargetSummary("t", "vllm", "0.34.0")) == ("0.33.0", "0.34.0")


# -- the comparison on made-up runs: each rule at its boundary, each text exact -------------


def made_engine(model: str | None = "m", label: str | None = "0", *,
                config: dict[str, Any] | None = None, leak: str = "ok", reason: str = "",
                **series: list[float]) -> Any:
    """An engine whose figures are the given per-minute values, minute 0 onwards."""
    from statistics import fmean

    from kvtop.baseline.model import EngineSummary, Figure

    return EngineSummary(model, label, config=config or {}, leak=leak, leak_reason=reason,
                         figures={k: Figure(fmean(v), tuple(v)) for k, v in series.items()},
                         minute_index={k: tuple(range(len(v))) for k, v in series.items()})


def made_run(*targets: Any, gpus: tuple[Any, ...] = (), name: str | None = "b",
             duration_s: float = 600.0) -> Any:
    from kvtop.baseline.model import Baseline

    return Baseline(name, "2026-12-05T10:00:00+00:00", "0.9.0", {"kind": "live"}, 1.0,
                    duration_s, 60.0, targets=list(targets), gpus=list(gpus))


def made_target(url: str, *engines: Any, probe: Any = None, kind: str | None = "vllm",
                version: str | None = "0.33.0") -> Any:
    from kvtop.baseline.model import TargetSummary

    return TargetSummary(url, kind, version, engines=list(engines), probe=probe)


def made_probe(requests: int = 4, failed: int = 0, error: str | None = None,
               ttft: tuple[float, ...] = (0.10, 0.11, 0.09, 0.10) * 3) -> Any:
    from kvtop.baseline.model import Figure, ProbeSummary

    return ProbeSummary("m", "text", 64, 512, requests, failed,
                        figures={"ttft": Figure(sum(ttft) / len(ttft), ttft)}, error=error)


def made_gpu(used: tuple[float, ...], *, index: int | None = 0, name: str = "H100",
             total: int | None = 80 * 2**30, host: str | None = None) -> Any:
    from kvtop.baseline.model import Figure, GpuSummary

    return GpuSummary(index, name, total, Figure(sum(used) / len(used), used), host=host)


GIB = 2**30
FOUR_LOW = [0.30, 0.31, 0.29, 0.30]  # four minutes each: p = 0.028, between 0.01 and 0.05
FOUR_HIGH = [0.60, 0.61, 0.59, 0.60]


def result_of(verdict: str, key: str = "kv_usage") -> Any:
    from kvtop.baseline.figures import SPECS
    from kvtop.baseline.judge import FigureResult

    return FigureResult(SPECS[key], 0.3, 0.6, verdict)  # type: ignore[arg-type]


def test_a_config_change_names_its_setting() -> None:
    from kvtop.baseline.compare import ConfigChange

    assert ConfigChange("num_gpu_blocks", 600, 420).to_json() == {
        "key": "num_gpu_blocks", "label": "KV blocks (num_gpu_blocks)", "baseline": 600,
        "now": 420}
    assert ConfigChange("max_model_len", 4096, 8192).to_json()["label"] == "max_model_len"


def test_config_changes_in_order_derived_ones_only_alone() -> None:
    """The KV tokens follow the block count: listed only when the count stayed; a setting
    kvtop does not compare is never listed; off -> on is a change like on -> off."""
    from kvtop.baseline.compare import config_changes

    base = {"kind": "vllm", "version": "0.33.0", "num_gpu_blocks": 600,
            "kv_tokens_total": 9600, "prefix_caching": False, "max_model_len": 4096}
    now = {"kind": "vllm", "version": "0.34.0", "num_gpu_blocks": 400,
           "kv_tokens_total": 6400, "prefix_caching": True, "max_model_len": 8192}
    assert [(c.key, c.baseline, c.now) for c in config_changes(base, now)] == [
        ("version", "0.33.0", "0.34.0"), ("num_gpu_blocks", 600, 400),
        ("prefix_caching", False, True)]
    fewer_tokens = {**base, "kv_tokens_total": 9584}
    assert [c.key for c in config_changes(base, fewer_tokens)] == ["kv_tokens_total"]
    assert config_changes(base, dict(base)) == []


def test_an_engine_row_in_json() -> None:
    from kvtop.baseline.compare import ConfigChange, EngineComparison
    from kvtop.baseline.judge import FigureResult
    from kvtop.baseline.matched_load import ARRIVALS

    load = FigureResult(ARRIVALS, 1.0, 2.0, "higher")
    row = EngineComparison("http://now", "http://base", "m", "0",
                           [ConfigChange("block_size", 16, 32)],
                           [result_of("same"), result_of("better", "waiting")], "leak", "ok",
                           "flat", load=load, load_range=(1.24, 1.96))
    assert row.verdicts() == ["same", "better", "better"]
    assert row.to_json() == {
        "target": "http://now", "baseline_target": "http://base", "model": "m",
        "engine": "0", "verdict": "better",
        "config_changes": [{"key": "block_size", "label": "block size (tokens)",
                            "baseline": 16, "now": 32}],
        "leak": {"baseline": "leak", "now": "ok", "verdict": "better", "reason": "flat"},
        "load": {**load.to_json(), "changed": True, "matched_range": [1.2, 2.0]},
        "figures": [result_of("same").to_json(), result_of("better", "waiting").to_json()]}
    lower = EngineComparison("t", "t", None, None, [], [], "ok", "ok", "",
                             load=FigureResult(ARRIVALS, 2.0, 1.0, "lower"))
    assert lower.to_json()["load"]["changed"] is True
    assert lower.to_json()["load"]["matched_range"] is None
    same = EngineComparison("t", "t", None, None, [], [], "ok", "ok", "",
                            load=FigureResult(ARRIVALS, 1.0, 1.0, "same"))
    assert same.to_json()["load"]["changed"] is False
    assert EngineComparison("t", "t", None, None, [], [], "ok", "ok", "").to_json()[
        "load"] is None


@pytest.mark.parametrize(("engine_verdict", "verdict", "code"), [
    ("worse", "worse", 1), ("better", "better", 0), ("same", "same", 0),
    ("unknown", "unknown", 3)])
def test_the_verdict_and_exit_code_of_a_comparison(engine_verdict: str, verdict: str,
                                                   code: int) -> None:
    from kvtop.baseline.compare import Comparison, EngineComparison

    run = made_run()
    row = EngineComparison("t", "t", "m", "0", [], [result_of(engine_verdict)], "unknown",
                           "unknown", "")
    result = Comparison(run, run, engines=[row])
    assert (result.verdict, result.exit_code()) == (verdict, code)
    assert result.to_json()["regression"] is (verdict == "worse")


def test_without_a_matched_engine_the_comparison_is_unknown() -> None:
    """A worse probe or GPU alone says nothing: no engine of the run was compared."""
    from kvtop.baseline.compare import Comparison, GpuComparison, ProbeComparison

    run = made_run()
    worse = Comparison(run, run, probes=[ProbeComparison("t", "m", [result_of("worse")])],
                       gpus=[GpuComparison(0, None, "H100", [], result_of("worse"))])
    assert worse.verdicts() == ["worse", "worse"]
    assert (worse.verdict, worse.exit_code()) == ("unknown", 3)


def test_probes_and_gpus_count_in_the_verdict() -> None:
    from kvtop.baseline.compare import (
        Comparison,
        EngineComparison,
        GpuComparison,
        ProbeComparison,
    )

    run = made_run()
    same = EngineComparison("t", "t", "m", "0", [], [result_of("same")], "ok", "ok", "")
    probe = Comparison(run, run, engines=[same],
                       probes=[ProbeComparison("t", "m", [result_of("worse")])])
    assert (probe.verdict, probe.exit_code()) == ("worse", 1)
    gpu = Comparison(run, run, engines=[same],
                     gpus=[GpuComparison(0, None, "H100", [], result_of("better"))])
    assert gpu.verdicts() == ["same", "same", "better"] and gpu.verdict == "better"


def test_a_comparison_in_json() -> None:
    from kvtop.baseline.compare import compare

    base = made_run(made_target("http://a", made_engine(
        config={"num_gpu_blocks": 600}, kv_usage=FOUR_LOW)),
        made_target("http://c", made_engine("gone", "3")), name="before",
        duration_s=1800.12345, gpus=(made_gpu((70.0 * GIB,) * 4),))
    now = made_run(made_target("http://a", made_engine(config={"num_gpu_blocks": 400},
                                                       kv_usage=FOUR_HIGH),
                               made_engine("other", "1")),
                   made_target("http://b", made_engine(kv_usage=FOUR_LOW)), name=None,
                   gpus=(made_gpu((70.0 * GIB,) * 4, name="H200", total=141 * GIB),))
    result = compare(base, now, alpha=0.05)
    doc = result.to_json()
    (engine,) = result.engines
    (gpu,) = result.gpus
    assert doc == {
        "kvtop_compare": 1, "verdict": "worse", "regression": True,
        "method": {"test": "mann-whitney-u", "alpha": 0.05, "noise_z": 2.576,
                   "design_effect": 3.0, "minute_s": 60.0, "min_values": 3,
                   "load": "arrivals/s per minute (else prompt + generation tokens/s); when it "
                           "changed, load-driven figures are judged on the minutes both runs "
                           "share a load range in",
                   "load_driven": ["e2e_p50", "e2e_p99", "itl_p50", "itl_p99", "kv_limited",
                                   "kv_usage", "preemptions_per_min", "ttft_p50", "ttft_p99",
                                   "waiting"]},
        "baseline": {"name": "before", "created": "2026-12-05T10:00:00+00:00",
                     "source": {"kind": "live"}, "duration_s": 1800.123},
        "now": {"name": None, "created": "2026-12-05T10:00:00+00:00",
                "source": {"kind": "live"}, "duration_s": 600.0},
        "config_changes": [
            {"target": "http://a", "model": "m", "engine": "0", "key": "num_gpu_blocks",
             "label": "KV blocks (num_gpu_blocks)", "baseline": 600, "now": 400},
            {"gpu": 0, "host": None, "key": "name", "label": "GPU", "baseline": "H100",
             "now": "H200"},
            {"gpu": 0, "host": None, "key": "memory_total_bytes",
             "label": "GPU memory (bytes)", "baseline": 80 * GIB, "now": 141 * GIB}],
        "engines": [engine.to_json()],
        "probes": [],
        "gpus": [{"index": 0, "host": None, "name": "H200",
                  "config_changes": [c.to_json() for c in gpu.config_changes],
                  "figures": [gpu.memory.to_json()]}],
        "unmatched": {"baseline": [{"target": "http://c", "model": "gone", "engine": "3"}],
                      "now": [{"target": "http://a", "model": "other", "engine": "1"},
                              {"target": "http://b", "model": "m", "engine": "0"}]},
        "notes": []}
    assert doc["engines"][0]["verdict"] == "worse"
    assert doc["engines"][0]["figures"][0]["verdict"] == "worse"  # at alpha 0.05


def test_the_alpha_reaches_every_figure() -> None:
    """Four minutes a side, every one apart: p = 0.028, a change at alpha 0.05 and
    unknown at the default 0.01, for the engine's figures, the load, a probe and a GPU."""
    from kvtop.baseline.compare import compare

    def runs(low: bool) -> Any:
        kv, load = (FOUR_LOW, [1.0, 1.01, 0.99, 1.0]) if low else (
            FOUR_HIGH, [3.0, 3.01, 2.99, 3.0])
        ttft = (0.10, 0.11, 0.09, 0.10) if low else (0.20, 0.21, 0.19, 0.20)
        used = tuple(g * GIB for g in ((10.0, 10.1, 9.9, 10.0) if low else
                                       (20.0, 20.1, 19.9, 20.0)))
        return made_run(made_target("http://a", made_engine(
            kv_usage=kv, hit_rate=[1 - v for v in kv], arrivals_per_s=load),
            probe=made_probe(ttft=ttft)), gpus=(made_gpu(used),))

    loose = compare(runs(True), runs(False), alpha=0.05)
    (engine,) = loose.engines
    assert engine.load is not None and engine.load.verdict == "higher"
    assert engine.load_range is None  # 1 and 3 arrivals/s: no load both saw
    figures = {f.spec.key: f for f in engine.figures}
    assert figures["hit_rate"].verdict == "worse"  # not load-driven: judged as it is
    assert figures["kv_usage"].verdict == "higher"  # follows the load
    assert loose.probes[0].figures[0].verdict == "worse"
    assert loose.gpus[0].memory.verdict == "higher"
    strict = compare(runs(True), runs(False))
    assert strict.alpha == 0.01 and loose.alpha == 0.05
    assert strict.engines[0].load.verdict == "unknown"  # type: ignore[union-attr]
    assert {f.verdict for f in strict.engines[0].figures} == {"unknown"}
    assert strict.probes[0].figures[0].verdict == "unknown"
    assert strict.gpus[0].memory.verdict == "unknown"


def test_a_changed_load_judges_load_driven_figures_on_the_load_both_saw() -> None:
    from kvtop.baseline.compare import compare

    def ramp(start: float) -> list[float]:
        return [start + 0.05 * i for i in range(20)]

    base = made_run(made_target("http://a", made_engine(
        arrivals_per_s=ramp(1.0), kv_usage=[0.3] * 20, hit_rate=[0.5] * 20)))
    now = made_run(made_target("http://a", made_engine(
        arrivals_per_s=ramp(1.5), kv_usage=[0.6] * 20, hit_rate=[0.5] * 20)))
    (engine,) = compare(base, now).engines
    assert engine.load is not None and engine.load.verdict == "higher"
    assert engine.load_range == pytest.approx((1.5, 1.95))
    figures = {f.spec.key: f for f in engine.figures}
    assert figures["kv_usage"].matched_load and figures["kv_usage"].verdict == "worse"
    assert figures["kv_usage"].note == ("at matched load: 10 and 10 minutes of "
                                        "1.50-1.95 arrivals/s")
    assert not figures["hit_rate"].matched_load
    assert (figures["hit_rate"].n_baseline, figures["hit_rate"].n_now) == (20, 20)
    (quieter,) = compare(now, base).engines
    assert quieter.load is not None and quieter.load.verdict == "lower"
    assert quieter.load_range == pytest.approx((1.5, 1.95))
    assert quieter.figures[0].matched_load and quieter.figures[0].verdict == "better"
    steady = compare(base, made_run(made_target("http://a", made_engine(
        arrivals_per_s=ramp(1.0), kv_usage=[0.6] * 20))))
    assert steady.engines[0].load_range is None
    assert not steady.engines[0].figures[0].matched_load
    assert steady.engines[0].figures[0].verdict == "worse"


def test_engines_pair_with_the_closest_first() -> None:
    """Same model, label and target beats same model and label, which beats the model
    alone; another model never pairs."""
    from kvtop.baseline.compare import compare

    base = made_run(made_target("http://a", made_engine(label="0", kv_usage=FOUR_LOW)),
                    made_target("http://b", made_engine(label="0", kv_usage=FOUR_LOW),
                                made_engine(label="1", kv_usage=FOUR_LOW)),
                    made_target("http://c", made_engine("gone")))
    now = made_run(made_target("http://b", made_engine(label="0"), made_engine(label="2")),
                   made_target("http://x", made_engine("new")))
    result = compare(base, now)
    assert [(e.target, e.baseline_target, e.engine) for e in result.engines] == [
        ("http://b", "http://b", "0"), ("http://b", "http://a", "2")]
    assert [(t, e.model, e.engine) for t, e in result.unmatched_baseline] == [
        ("http://b", "m", "1"), ("http://c", "gone", "0")]
    assert [(t, e.model) for t, e in result.unmatched_now] == [("http://x", "new")]
    relabelled = compare(base, made_run(made_target("http://c", made_engine(label="1"))))
    assert [(e.baseline_target, e.engine) for e in relabelled.engines] == [("http://b", "1")]


def test_match_engine_finds_the_closest_or_none() -> None:
    from kvtop.baseline.compare import match_engine

    base = made_run(made_target("http://a", made_engine(label="0")),
                    made_target("http://b", made_engine(label="0"), made_engine(label="1")))
    found = match_engine(base, "http://b", "m", "0")
    assert found is not None and (found[0].target, found[1].engine) == ("http://b", "0")
    found = match_engine(base, "http://z", "m", "1")
    assert found is not None and (found[0].target, found[1].engine) == ("http://b", "1")
    found = match_engine(base, "http://z", "m", "9")
    assert found is not None and (found[0].target, found[1].engine) == ("http://a", "0")
    assert match_engine(base, "http://a", "other", "0") is None
    assert match_engine(made_run(), "http://a", "m", "0") is None


def test_runs_of_other_models_are_refused() -> None:
    from kvtop.baseline.compare import ModelMismatch, compare

    base = made_run(made_target("http://a", made_engine("Llama"), made_engine(None, "1")),
                    name="monday")
    with pytest.raises(ModelMismatch) as raised:
        compare(base, made_run(made_target("http://a", made_engine("qwen"))))
    assert str(raised.value) == (
        "the baseline monday is of model(s) (unnamed), 'Llama', this run serves 'qwen': a "
        "comparison across models would mean nothing; save a baseline of this model first")
    with pytest.raises(ModelMismatch, match=r"^the baseline  is of model"):
        compare(made_run(made_target("http://a", made_engine("llama")), name=None),
                made_run(made_target("http://a", made_engine("qwen"))))
    # one model in common is enough; a run without engines is no mismatch
    assert len(compare(base, made_run(made_target("http://a", made_engine("qwen"),
                                                  made_engine("Llama")))).engines) == 1
    assert compare(base, made_run(made_target("http://a"))).verdict == "unknown"
    assert compare(made_run(made_target("http://a")), base).engines == []


def test_the_kind_and_version_are_settings_of_the_engine() -> None:
    from kvtop.baseline.compare import compare

    base = made_run(made_target("http://a", made_engine(), kind="vllm", version="0.33.0"))
    now = made_run(made_target("http://a", made_engine(), kind="sglang", version="0.5.0"))
    assert [(c.key, c.baseline, c.now) for c in compare(base, now).engines[0].config_changes
            ] == [("kind", "vllm", "sglang"), ("version", "0.33.0", "0.5.0")]


def test_an_inferred_version_without_a_version_stays_unknown() -> None:
    from kvtop.baseline.compare import _versions
    from kvtop.baseline.model import TargetSummary

    guessed = TargetSummary("t", "vllm", "0.10.2+", version_inferred=True)
    unknown = TargetSummary("t", "vllm", None, version_inferred=True)
    assert _versions(unknown, guessed) == (None, "0.10.2+ (inferred)")
    assert _versions(guessed, unknown) == ("0.10.2+ (inferred)", None)


def test_a_probe_is_compared_once_a_target_and_says_what_failed() -> None:
    from kvtop.baseline.compare import compare

    def run_of(probe: Any) -> Any:
        return made_run(made_target("http://a", made_engine(label="0"), made_engine(label="1"),
                                    probe=probe))

    base = run_of(made_probe())
    same = compare(base, run_of(made_probe()))
    assert [(p.target, p.model, p.note) for p in same.probes] == [("http://a", "m", None)]
    assert [f.spec.key for f in same.probes[0].figures] == ["ttft", "total"]
    assert same.probes[0].to_json() == {
        "target": "http://a", "model": "m", "note": None, "verdict": "same",
        "figures": [f.to_json() for f in same.probes[0].figures]}
    assert same.probes[0].figures[0].verdict == "same"
    missing = compare(base, run_of(None)).probes[0]
    assert missing.note == "not probed in this run (--probe sends the request)"
    assert missing.figures[0].note == "not known in this run"
    failed = compare(base, run_of(made_probe(requests=5, failed=1, error="timeout")))
    assert failed.probes[0].note == "1 of 5 probe requests failed: timeout"
    assert compare(run_of(None), base).probes == []


def test_gpus_pair_by_place_and_a_lost_reading_is_noted() -> None:
    from kvtop.baseline.compare import compare

    used = (10.0 * GIB,) * 4
    base = made_run(made_target("http://a", made_engine()),
                    gpus=(made_gpu(used, index=0), made_gpu(used, index=1),
                          made_gpu(used, index=None, host="node-7")))
    now = made_run(made_target("http://a", made_engine()),
                   gpus=(made_gpu(used, index=1, name="H200"),
                         made_gpu(used, index=None, host="node-7")))
    result = compare(base, now)
    assert [(g.index, g.host, g.name) for g in result.gpus] == [
        (1, None, "H200"), (None, "node-7", "H100")]
    assert [c.key for c in result.gpus[0].config_changes] == ["name"]
    assert result.gpus[1].config_changes == [] and result.notes == []
    assert result.gpus[1].memory.spec.key == "memory_used_bytes"
    blind = compare(base, made_run(made_target("http://a", made_engine())))
    assert blind.gpus == []
    assert blind.notes == ["the baseline has GPU readings, this run none"]
    assert compare(made_run(made_target("http://a", made_engine())), now).notes == []


def test_the_leak_row_carries_both_runs_states_and_the_reason_now() -> None:
    from kvtop.baseline.compare import compare

    base = made_run(made_target("http://a", made_engine(leak="ok", reason="flat")))
    now = made_run(made_target("http://a", made_engine(leak="leak",
                                                       reason="12 blocks never freed")))
    (engine,) = compare(base, now).engines
    assert (engine.leak_baseline, engine.leak_now, engine.leak_reason) == (
        "ok", "leak", "12 blocks never freed")
    assert engine.leak_verdict == "worse"


def test_closeness_counts_what_two_engines_share() -> None:
    """The scale `_closeness` documents: 3 same model, label and target; 2 same model and
    label; 1 same model; 0 another model."""
    from kvtop.baseline.compare import _closeness
    from kvtop.baseline.model import EngineSummary, TargetSummary

    base = (TargetSummary("http://a"), EngineSummary("m", "0"))
    assert _closeness(base, TargetSummary("http://a"), EngineSummary("m", "0")) == 3
    assert _closeness(base, TargetSummary("http://b"), EngineSummary("m", "0")) == 2
    assert _closeness(base, TargetSummary("http://a"), EngineSummary("m", "1")) == 1
    assert _closeness(base, TargetSummary("http://a"), EngineSummary("n", "0")) == 0
