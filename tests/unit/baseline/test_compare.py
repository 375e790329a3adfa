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
    assert verdicts(result)["prompt_tps"] == verdicts(result)["generation_tps"] == "same"
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


def test_double_the_arrival_rate(recordings: Recordings, healthy: Any) -> None:
    result = compare(healthy, summarise(recordings.path("double_rate")))
    assert {"kv_usage", "waiting", "ttft_p99"} <= flagged(result, "worse")
    # and the load figures say why: twice the tokens, more requests running
    assert {"prompt_tps", "generation_tps", "running"} <= flagged(result, "higher")
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
    ("double_rate", "healthy", {"kv_usage", "waiting", "ttft_p99"}),
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
