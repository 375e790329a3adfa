"""The figures of `kvtop baseline show` and `kvtop compare` as a person reads them: each unit
in its own words, milliseconds below a second, whole numbers once they are large, and a
change signed, with its percentage (points for a fraction)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvtop.baseline.model import (
    Baseline,
    EngineSummary,
    Figure,
    GpuSummary,
    ProbeSummary,
    TargetSummary,
)
from kvtop.baseline.text import DASH, GIB, change, number, render_baseline, render_comparison
from kvtop.cli import main


@pytest.mark.parametrize(("value", "unit", "text"), [
    (None, "seconds", DASH),
    (0.1234, "fraction", "12.3 %"),
    (0.0042, "seconds", "4.2 ms"),
    (0.004249, "seconds", "4.2 ms"),  # not 4.3: a thousand milliseconds to the second
    (-0.0042, "seconds", "-4.2 ms"),
    (0.01, "seconds", "10 ms"),
    (0.2504, "seconds", "250 ms"),
    (-0.5, "seconds", "-500 ms"),
    (1.0, "seconds", "1.00 s"),
    (-2.345, "seconds", "-2.35 s"),
    (3.14159, "per_min", "3.14/min"),
    (9.94, "tokens_per_s", "9.9/s"),
    (-9.94, "tokens_per_s", "-9.9/s"),
    (10.0, "tokens_per_s", "10/s"),
    (1234.6, "tokens_per_s", "1235/s"),
    (1.5 * GIB, "bytes", "1.50 GiB"),
    (2.005, "count", "2.00"),
])
def test_each_unit_reads_in_its_own_words(value: float | None, unit: str, text: str) -> None:
    assert number(value, unit) == text


@pytest.mark.parametrize(("delta", "pct", "unit", "text"), [
    (None, None, "seconds", ""),
    (0.015, 5.0, "fraction", "+1.5 pts"),
    (-0.015, -5.0, "fraction", "-1.5 pts"),
    (0.2, 25.4, "seconds", "+200 ms (+25 %)"),
    (-0.2, -25.4, "seconds", "-200 ms (-25 %)"),
    (3.0, None, "per_min", "+3.00/min"),
    (0.0, 0.0, "tokens_per_s", "+0.0/s (+0 %)"),
])
def test_a_change_is_signed_with_its_percentage(delta: float | None, pct: float | None,
                                                unit: str, text: str) -> None:
    assert change(delta, pct, unit) == text


# -- `kvtop baseline show` and `kvtop baseline list`, whole ------------------------------

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
H100_BYTES = 85_520_809_984  # what NVML reports for an H100 80GB HBM3: 79.65 GiB


def saved_baseline() -> Baseline:
    """Half an hour of a vLLM 0.33 server on an H100 (one engine, a probe, a restart), and a
    second server, an SGLang one, with no figures; the local GPU and one an exporter
    reported."""
    engine = EngineSummary(
        MODEL, "0",
        config={"num_gpu_blocks": 27000, "block_size": 16, "prefix_caching": True,
                "cache_dtype": "auto", "kv_tokens_total": None,
                "gpu_memory_utilization": 0.9},
        figures={
            "kv_usage": Figure(0.4123, summary={"p5": 0.1034, "p50": 0.4123, "p95": 0.8871,
                                                "max": 0.9512, "samples": 1798.0}),
            "idle_kv_usage": Figure(0.0, summary={"p5": None, "samples": 12.0}),
            "preemptions_per_min": Figure(0.25),
            "waiting": Figure(1.5, summary={"p50": 1.0, "max": 7.0}),
            "running": Figure(12.25),
            "prompt_tps": Figure(2345.6),
            "generation_tps": Figure(8.26),
            "ttft_p50": Figure(0.0421), "ttft_p99": Figure(0.3127),
            "itl_p50": Figure(0.0084),
            "e2e_p50": Figure(2.5), "e2e_p99": Figure(12.3456)},
        samples=1798, minutes=30, duration_s=1800.0, leak="ok", restarts=1)
    probe = ProbeSummary(MODEL, "text", max_tokens=64, prompt_tokens=512, requests=10,
                         failed=1, figures={"ttft": Figure(0.0412)})
    return Baseline(
        "before-upgrade", "2026-12-01T09:30:00+00:00", "0.9.0",
        {"kind": "recording", "recording": "/srv/runs/monday.jsonl.gz"}, interval_s=1.0,
        duration_s=1800.0, minute_s=60.0,
        targets=[TargetSummary("http://gpu-1:8000/metrics", "vllm", "0.33.0", scrapes=1800,
                               failed_scrapes=2, engines=[engine], probe=probe),
                 TargetSummary("http://gpu-2:30000/metrics", "sglang", None, scrapes=40,
                               engines=[EngineSummary(None, None, samples=40, minutes=0)],
                               probe=ProbeSummary("qwen", "token_ids", 16, None, 3, 3))],
        gpus=[GpuSummary(0, "NVIDIA H100 80GB HBM3", H100_BYTES,
                         Figure(72.5 * GIB)),
              GpuSummary(None, "NVIDIA A10G", None, host="node-7", source="dcgm")])


SHOWN = """\
baseline before-upgrade ({path})
  saved 2026-12-01T09:30:00+00:00 by kvtop 0.9.0, 30.0 min recording /srv/runs/monday.jsonl.gz

http://gpu-1:8000/metrics  vllm 0.33.0  (1800 scrapes, 2 failed)
model meta-llama/Llama-3.1-8B-Instruct  engine 0
  config: num_gpu_blocks 27000, block_size 16, prefix_caching on, cache_dtype auto, \
gpu_memory_utilization 0.9
  1798 scrapes, 30 minutes, leak detector: ok, 1 restart(s)
  KV usage p50                   41.2 %  (p5 10.3 %, p50 41.2 %, p95 88.7 %, max 95.1 %)
  KV used at idle                 0.0 %
  preemptions/min              0.25/min
  waiting (mean)                   1.50  (p50 1.00, max 7.00)
  running (mean)                  12.25
  prefix hit rate                     —
  prompt tokens/s                2346/s
  generation tokens/s             8.3/s
  TTFT p50                        42 ms
  TTFT p99                       313 ms
  ITL p50                        8.4 ms
  ITL p99                             —
  E2E p50                        2.50 s
  E2E p99                       12.35 s
  prefix reuse share                  —
  block lifetime p50                  —
  block lifetime p99                  —
  limited by KV capacity              —
  probe: 10 x text prompt of 512 tokens, 64 out, model meta-llama/Llama-3.1-8B-Instruct, 1 failed
  probe TTFT                      41 ms
  probe total                         —

http://gpu-2:30000/metrics  sglang  (40 scrapes, 0 failed)
engine
  config: —
  40 scrapes, 0 minutes, leak detector: unknown
  KV usage p50                        —
  KV used at idle                     —
  preemptions/min                     —
  waiting (mean)                      —
  running (mean)                      —
  prefix hit rate                     —
  prompt tokens/s                     —
  generation tokens/s                 —
  TTFT p50                            —
  TTFT p99                            —
  ITL p50                             —
  ITL p99                             —
  E2E p50                             —
  E2E p99                             —
  prefix reuse share                  —
  block lifetime p50                  —
  block lifetime p99                  —
  limited by KV capacity              —
  probe: 3 x token_ids prompt of ? tokens, 16 out, model qwen, 3 failed
  probe TTFT                          —
  probe total                         —
GPU 0 NVIDIA H100 80GB HBM3: 72.50 GiB used of 79.65 GiB
GPU ? on node-7 NVIDIA A10G: — used of —
"""


@pytest.fixture
def data_home(data_home: Path) -> Path:
    """The shared one (tests/conftest.py), made: these tests write baselines straight in."""
    data_home.mkdir(parents=True)
    return data_home


def shown(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
          *argv: str) -> str:
    """What `kvtop ARGV` prints on a terminal."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(list(argv)) == 0
    out, err = capsys.readouterr()
    assert not err
    return out


def test_baseline_show_prints_every_figure_in_its_unit(
        data_home: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = data_home / "before-upgrade.json"
    path.write_text(saved_baseline().dumps())
    assert shown(capsys, monkeypatch, "baseline", "show", "before-upgrade") == SHOWN.format(
        path=path)


def test_a_live_baseline_shows_no_recording(data_home: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    live = Baseline(None, "2026-12-01T09:30:00+00:00", "0.9.0", {"kind": "live"},
                    interval_s=1.0, duration_s=7200.0, minute_s=60.0)
    path = data_home / "nightly.json"
    path.write_text(live.dumps())
    assert shown(capsys, monkeypatch, "baseline", "show", "nightly") == (
        f"baseline ({path})\n  saved 2026-12-01T09:30:00+00:00 by kvtop 0.9.0, 2.0 h live\n")


def test_baseline_list_prints_name_date_length_and_models(
        data_home: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert shown(capsys, monkeypatch, "baseline", "list") == "no saved baselines\n"
    base = saved_baseline()
    (data_home / "before-upgrade.json").write_text(base.dumps())
    base.duration_s = 7199.0  # just under two hours: still in minutes
    base.targets[0].engines.append(EngineSummary("Qwen/Qwen2.5-7B-Instruct", "1"))
    (data_home / "a-long-one.json").write_text(base.dumps())
    base.duration_s = 7200.0
    (data_home / "two-hours.json").write_text(base.dumps())
    (data_home / "broken.json").write_text("{")
    assert shown(capsys, monkeypatch, "baseline", "list") == f"""\
NAME                     SAVED                        LENGTH  MODELS
a-long-one               2026-12-01T09:30:00+00:00 120.0 min  \
None, Qwen/Qwen2.5-7B-Instruct, {MODEL}
before-upgrade           2026-12-01T09:30:00+00:00  30.0 min  None, {MODEL}
broken                   unreadable: {data_home / "broken.json"}: \
not a complete JSON document (cut off?): \
Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
two-hours                2026-12-01T09:30:00+00:00     2.0 h  \
None, Qwen/Qwen2.5-7B-Instruct, {MODEL}
"""


# -- `kvtop compare`, whole --------------------------------------------------------------

GPU_1, GPU_2 = "http://gpu-1:8000/metrics", "http://gpu-2:8000/metrics"


def figure(key: str, label: str, unit: str, baseline: float | None, now: float | None,
           delta: float | None, pct: float | None, p: float | None, verdict: str,
           note: str | None = None, threshold: float | None = None,
           matters: float | None = None) -> dict[str, object]:
    return {"figure": key, "label": label, "unit": unit, "baseline": baseline, "now": now,
            "delta": delta, "delta_pct": pct, "p_value": p, "verdict": verdict, "note": note,
            "threshold": threshold, "matters": matters}


def comparison() -> dict[str, object]:
    """A compare document (docs/compare-json.md): the same server after an upgrade that took
    KV blocks away and leaks, every kind of figure row, a probe, GPUs (one swapped), an
    engine on each side only and a note."""
    blocks = {"key": "num_gpu_blocks", "label": "KV blocks (num_gpu_blocks)",
              "baseline": 27000, "now": 18900}
    return {
        "kvtop_compare": 1, "verdict": "worse", "regression": True,
        "method": {"test": "mann-whitney-u", "alpha": 0.01, "minute_s": 60.0, "min_values": 3},
        "baseline": {"name": "before-upgrade", "created": "2026-12-01T09:30:00+00:00",
                     "source": {"kind": "recording", "recording": "/srv/runs/monday.jsonl.gz"},
                     "duration_s": 1800.0},
        "now": {"name": None, "created": None, "source": {"kind": "live"}, "duration_s": 600.0},
        "config_changes": [
            {"target": GPU_1, "model": MODEL, "engine": "0", **blocks},
            {"target": GPU_2, "model": None, "engine": None, "key": "prefix_caching",
             "label": "prefix caching", "baseline": True, "now": False},
            {"gpu": 0, "host": "node-7", "key": "name", "label": "GPU",
             "baseline": "NVIDIA H100 80GB HBM3", "now": "NVIDIA H200"},
            {"gpu": None, "host": None, "key": "memory_total_bytes",
             "label": "GPU memory (bytes)", "baseline": 85520809984, "now": 150754820096}],
        "engines": [
            {"target": GPU_1, "model": MODEL, "engine": "0", "verdict": "worse",
             "config_changes": [blocks],
             "leak": {"baseline": "ok", "now": "leak", "verdict": "worse",
                      "reason": "827 blocks held with nothing running or waiting"},
             "figures": [
                 figure("kv_usage", "KV usage p50", "fraction", 0.289, 0.403, 0.114, 39.5,
                        1.2e-05, "worse", threshold=0.052, matters=0.03),
                 figure("idle_kv_usage", "KV used at idle", "fraction", None, None, None,
                        None, None, "unknown", "not known in either run"),
                 figure("preemptions_per_min", "preemptions/min", "per_min", 0.0, 2.5, 2.5,
                        None, 0.001, "worse"),
                 figure("waiting", "waiting (mean)", "count", 0.75, 0.5, -0.25, -33.3, 0.2,
                        "unknown", "could not have seen a change of 0.5 count", matters=0.5),
                 figure("running", "running (mean)", "count", 10.0, 12.0, 2.0, 20.0, 0.004,
                        "higher"),
                 figure("hit_rate", "prefix hit rate", "fraction", 0.62, 0.71, 0.09, 14.5,
                        0.0004, "better"),
                 figure("prompt_tps", "prompt tokens/s", "tokens_per_s", 2345.6, 2100.0,
                        -245.6, -10.47, 0.03, "lower"),
                 figure("ttft_p99", "TTFT p99", "seconds", 0.3127, 0.8, 0.4873, 155.8, 2e-06,
                        "worse", threshold=0.0625, matters=0.0625)],
             "load": {"figure": "tokens_per_s", "verdict": "lower", "baseline": 2800.0,
                      "now": 2500.0, "changed": True,
                      "matched_range": [2400.0, 2700.0]}},
            {"target": GPU_2, "model": None, "engine": None, "verdict": "unknown",
             "config_changes": [],
             "leak": {"baseline": "unknown", "now": "watch", "verdict": "unknown",
                      "reason": "40 blocks held at idle (confirming)"},
             "load": {"figure": "arrivals_per_s", "verdict": "higher", "baseline": 0.5,
                      "now": 1.25, "changed": True, "matched_range": None},
             "figures": []}],
        "probes": [
            {"target": GPU_1, "model": MODEL, "verdict": "same",
             "note": "2 of 10 probe requests failed",
             "figures": [
                 figure("ttft", "probe TTFT", "seconds", 0.0412, 0.0398, -0.0014, -3.4, 0.5,
                        "same"),
                 figure("total", "probe total", "seconds", 1.234, None, None, None, None,
                        "unknown", "not known in this run")]},
            {"target": GPU_2, "model": "qwen", "verdict": "unknown", "note": None,
             "figures": []}],
        "gpus": [
            {"index": 0, "host": "node-7", "name": "NVIDIA H200", "config_changes": [],
             "figures": [figure("memory_used_bytes", "GPU memory used", "bytes", 72.5 * GIB,
                                73.5 * GIB, GIB, 1.4, 0.3, "same")]},
            {"index": None, "host": None, "name": "NVIDIA A10G", "config_changes": [],
             "figures": []}],
        "unmatched": {"baseline": [{"target": GPU_2, "model": "Qwen/Qwen2.5-7B-Instruct",
                                    "engine": "1"}],
                      "now": [{"target": GPU_1, "model": "mistral", "engine": None}]},
        "notes": ["the baseline has GPU readings, this run none"]}


COMPARED = f"""\
kvtop compare: WORSE
  baseline 'before-upgrade' 30.0 min, recording /srv/runs/monday.jsonl.gz, taken \
2026-12-01T09:30:00+00:00
  now      10.0 min, live, taken ?

Config changes (they explain most differences):
  {GPU_1}  model {MODEL}  engine 0: KV blocks (num_gpu_blocks) 27000 -> 18900
  {GPU_2}: prefix caching on -> off
  GPU 0 on node-7: GPU NVIDIA H100 80GB HBM3 -> NVIDIA H200
  GPU ?: GPU memory (bytes) 85520809984 -> 150754820096

{GPU_1}  model {MODEL}  engine 0: WORSE
  the load changed: 2800 -> 2500 tokens/s (lower); load-driven figures are compared on the \
minutes both runs spent at 2400-2700
  figure                       baseline          now               change    counts at       p \
 verdict
  KV usage p50                   28.9 %       40.3 %            +11.4 pts     ±5.2 pts  <0.001 \
 WORSE
  KV used at idle                     —            —                                           \
 unknown  (not known in either run)
  preemptions/min              0.00/min     2.50/min            +2.50/min                0.001 \
 WORSE
  waiting (mean)                   0.75         0.50        -0.25 (-33 %)        ±0.50   0.200 \
 unknown  (could not have seen a change of 0.5 count)
  running (mean)                  10.00        12.00        +2.00 (+20 %)                0.004 \
 higher
  prefix hit rate                62.0 %       71.0 %             +9.0 pts               <0.001 \
 BETTER
  prompt tokens/s                2346/s       2100/s       -246/s (-10 %)                0.030 \
 lower
  TTFT p99                       313 ms       800 ms     +487 ms (+156 %)       ±62 ms  <0.001 \
 WORSE
  leak detector                      ok         leak                               WORSE  (827 \
blocks held with nothing running or waiting)
  not judged (too little evidence: see each row): waiting (mean)

{GPU_2}: UNKNOWN
  the load changed: 0.5 -> 1.25 arrivals/s (higher); no minute of one run saw the other's \
load: what follows the load is marked higher or lower, not worse
  figure                       baseline          now               change    counts at       p \
 verdict
  leak detector                 unknown        watch                               unknown

probe {GPU_1} (model {MODEL}): SAME
  2 of 10 probe requests failed
  figure                       baseline          now               change    counts at       p \
 verdict
  probe TTFT                      41 ms        40 ms       -1.4 ms (-3 %)                0.500 \
 same
  probe total                    1.23 s            —                                           \
 unknown  (not known in this run)

probe {GPU_2} (model qwen): UNKNOWN
  figure                       baseline          now               change    counts at       p \
 verdict

GPU 0 on node-7 NVIDIA H200
  figure                       baseline          now               change    counts at       p \
 verdict
  GPU memory used             72.50 GiB    73.50 GiB     +1.00 GiB (+1 %)                0.300 \
 same

GPU ? NVIDIA A10G
  figure                       baseline          now               change    counts at       p \
 verdict
in the baseline only: {GPU_2}  model Qwen/Qwen2.5-7B-Instruct  engine 1
in this run only: {GPU_1}  model mistral
note: the baseline has GPU readings, this run none

Judged on per-minute values: Mann-Whitney rank test, p < 0.01, beyond run-to-run noise and \
large enough to matter (the 'counts at' column); SAME only where the runs could have seen such \
a change, else unknown (docs/baseline-format.md).
"""


def test_compare_prints_config_changes_then_every_row_aligned() -> None:
    assert render_comparison(comparison()) == COMPARED


def test_outside_text_is_cut_at_its_own_length() -> None:
    """Config values and GPU names at 80 characters, a figure's note at 120, the leak's
    reason at 160, a probe's note and the notes at 300: one character more is cut, with an
    ellipsis; the run compared with is a baseline file, named by its path."""
    doc = comparison()
    doc["now"] = {"name": "after", "created": "2026-12-02T09:30:00+00:00",
                  "source": {"kind": "baseline", "baseline": "/srv/after.json"},
                  "duration_s": 10800.0}
    doc["config_changes"] = [{"gpu": 1, "host": None, "key": "name", "label": "GPU",
                              "baseline": "a" * 81, "now": "b" * 80}]
    (engine, _) = doc["engines"]  # type: ignore[misc]
    engine["leak"]["reason"] = "r" * 161
    engine["figures"][1]["note"] = "n" * 121
    doc["probes"][0]["note"] = "p" * 301  # type: ignore[index]
    doc["gpus"][0]["name"] = "g" * 81  # type: ignore[index]
    doc["notes"] = ["t" * 301]
    lines = render_comparison(doc).splitlines()
    assert lines[2] == ("  now      'after' 3.0 h, baseline /srv/after.json, "
                        "taken 2026-12-02T09:30:00+00:00")
    assert lines[5] == f"  GPU 1: GPU {'a' * 79}… -> {'b' * 80}"
    assert lines[11].endswith(f"unknown  ({'n' * 119}…)")
    assert lines[18].endswith(f"WORSE  ({'r' * 159}…)")
    assert f"  {'p' * 299}…" in lines
    assert f"GPU 0 on node-7 {'g' * 79}…" in lines
    assert f"note: {'t' * 299}…" in lines


def test_a_compare_with_nothing_to_judge_says_only_that() -> None:
    """No config change, engine, probe or GPU, and a document from before `notes` (readers
    ignore what a version-1 document lacks): the two runs and the method, nothing else; a
    run of 2 h 21 min reads in hours."""
    doc = {"verdict": "unknown", "method": {"alpha": 0.05},
           "baseline": {"name": "nightly", "created": "2026-12-01T09:30:00+00:00",
                        "source": {"kind": "live"}, "duration_s": 8460.0},
           "now": {"name": None, "created": None,
                   "source": {"kind": "recording", "recording": "/srv/x.jsonl.gz"},
                   "duration_s": None},
           "config_changes": [], "engines": [], "probes": [], "gpus": [],
           "unmatched": {"baseline": [], "now": []}}
    assert render_comparison(doc) == """\
kvtop compare: UNKNOWN
  baseline 'nightly' 2.4 h, live, taken 2026-12-01T09:30:00+00:00
  now      0.0 min, recording /srv/x.jsonl.gz, taken ?

Judged on per-minute values: Mann-Whitney rank test, p < 0.05, beyond run-to-run noise \
and large enough to matter (the 'counts at' column); SAME only where the runs could have \
seen such a change, else unknown (docs/baseline-format.md).
"""


def test_an_inferred_version_is_shown_as_inferred() -> None:
    from kvtop.baseline.model import Baseline, TargetSummary

    baseline = Baseline("b", "2026-12-01T09:30:00+00:00", "0.1.0", {"kind": "live"}, 1.0,
                        600.0, 60.0, targets=[TargetSummary(
                            "http://h:8000/metrics", "vllm", "0.10.2+",
                            version_inferred=True)])
    assert "http://h:8000/metrics  vllm 0.10.2+ (inferred)  (0 scrapes, 0 failed)" in \
        render_baseline(baseline, "/b.json")
