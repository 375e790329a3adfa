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
