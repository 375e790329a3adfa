"""Workloads: the lengths asked for, shared where they should be."""

from __future__ import annotations

import gzip
import itertools
import json
import warnings
from collections import Counter
from pathlib import Path

import pytest

from kvtop.load.workloads import Planned, Workload, WorkloadError, make_workload
from kvtop.sim import workloads as traces


def take(workload: Workload, n: int) -> list[tuple[object, ...]]:
    """The first ``n`` plans as (class, prompt, output, shared, at)."""
    return [(p.cls, p.prompt_tokens, p.max_tokens, p.shared, p.at)
            for p in itertools.islice(workload, n)]


def azure_rows(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    """An Azure CSV of (seconds after 18:15, prompt, output) rows, under a minute apart."""
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{t:010.7f},{prompt},{output}\n" for t, prompt, output in rows),
        encoding="utf-8")
    return path


def test_mixed_has_three_classes_that_fit_the_model() -> None:
    plans = list(itertools.islice(make_workload("mixed", model_len=4096, seed=1), 3000))
    classes = Counter(p.cls for p in plans)
    assert set(classes) == {"short", "long-prompt", "long-output"}
    assert all(900 < n < 1100 for n in classes.values())
    assert all(p.prompt_tokens + p.max_tokens < 4096 for p in plans)
    by = {c: [p for p in plans if p.cls == c] for c in classes}
    assert min(p.prompt_tokens for p in by["long-prompt"]) >= 1024
    assert max(p.prompt_tokens for p in by["short"]) <= 256
    assert min(p.max_tokens for p in by["long-output"]) >= 512
    assert max(p.max_tokens for p in by["short"]) <= 128


def test_lengths_shrink_to_a_small_model() -> None:
    plans = list(itertools.islice(make_workload("mixed", model_len=512), 300))
    assert all(p.prompt_tokens + p.max_tokens < 512 for p in plans)


def test_shared_prefix_shares_one_context() -> None:
    workload = make_workload("shared-prefix", model_len=4096)
    plans = list(itertools.islice(workload, 50))
    assert {p.shared for p in plans} == {((("shared-context",), 2048),)}
    assert all(2048 + 16 <= p.prompt_tokens <= 2048 + 128 for p in plans)
    assert workload.expected_hit_rate == pytest.approx(2048 / (2048 + 72))


def azure_csv(path: Path) -> Path:
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.0000000,374,44\n"
                    "2023-11-16 18:15:48.0000000,2000,10\n"
                    "2023-11-16 18:15:56.0000000,5000,300\n", encoding="utf-8")
    return path


def test_a_trace_file_is_replayed_in_laps_at_the_asked_rate(tmp_path: Path) -> None:
    workload = make_workload(f"trace:{azure_csv(tmp_path / 'a.csv')}", model_len=8192)
    assert workload.timed
    plans = list(itertools.islice(workload, 6))
    assert [p.at for p in plans[:3]] == [0.0, 2.0, 10.0]
    assert [p.cls for p in plans[:3]] == ["trace-short", "trace-medium", "trace-long"]
    assert [(p.prompt_tokens, p.max_tokens) for p in plans[:3]] == [(374, 44), (2000, 10),
                                                                     (5000, 300)]
    lap = plans[3].at
    assert lap is not None and lap > 10.0 and plans[5].at == lap + 10.0
    faster = make_workload(f"trace:{tmp_path / 'a.csv'}", model_len=8192, rate=3.0)
    assert faster.mean_rate == pytest.approx(3.0)
    assert [p.at for p in itertools.islice(faster, 3)] == pytest.approx([0.0, 0.2, 1.0])


def test_a_mooncake_trace_shares_its_hashed_blocks(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
            {"timestamp": 500, "input_length": 700, "output_length": 5, "hash_ids": [0, 7]}]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    first, second = itertools.islice(make_workload(f"trace:{path}", model_len=8192), 2)
    assert first.shared[0] == second.shared[0] == ((0, 0), 512)
    assert first.shared[1] != second.shared[1]


@pytest.mark.parametrize("spec", ["nonsense", "trace:/nowhere/x.csv"])
def test_unknown_workloads_and_missing_traces_are_refused(spec: str) -> None:
    with pytest.raises(WorkloadError):
        make_workload(spec, model_len=4096)


def test_a_broken_trace_is_refused_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("when,what\n1,2\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match="as an Azure CSV trace"):
        make_workload(f"trace:{bad}", model_len=4096)


def test_the_real_traces_replay() -> None:
    for name in ("mooncake", "azure"):
        plans = list(itertools.islice(make_workload(name, model_len=32768), 200))
        assert all(p.prompt_tokens + p.max_tokens < 32768 for p in plans)
        times = [p.at for p in plans]
        assert times == sorted(times)


def test_a_seed_gives_the_same_mixed_plans_in_any_process() -> None:
    mixed = make_workload("mixed", model_len=4096, seed=1)
    assert (mixed.name, mixed.timed, mixed.mean_rate, mixed.expected_hit_rate) == \
        ("mixed", False, None, None)
    assert take(mixed, 6) == [("short", 209, 40, (), None), ("long-prompt", 1265, 95, (), None),
                              ("long-prompt", 1991, 115, (), None),
                              ("long-prompt", 1453, 44, (), None),
                              ("long-prompt", 1082, 81, (), None),
                              ("long-prompt", 1028, 121, (), None)]
    # seed 0 and a server that does not say its context length: 4096 tokens
    assert take(make_workload("mixed", model_len=None), 4) == [
        ("long-prompt", 1885, 37, (), None), ("long-prompt", 2019, 83, (), None),
        ("long-prompt", 2000, 77, (), None), ("long-output", 119, 654, (), None)]
    assert next(make_workload("mixed", model_len=None)) == Planned("long-prompt", 1885, 37)


def test_mixed_lengths_follow_the_context_up_to_their_caps() -> None:
    # 64k tokens: long prompts 4096-8192 (their caps), long outputs 512-1024
    assert take(make_workload("mixed", model_len=65536, seed=2), 7) == [
        ("short", 87, 42, (), None), ("long-prompt", 5481, 126, (), None),
        ("long-output", 142, 769, (), None), ("long-output", 118, 548, (), None),
        ("long-output", 238, 674, (), None), ("long-prompt", 7319, 124, (), None),
        ("long-output", 159, 967, (), None)]
    # 512 tokens: long prompts 128-256 (a quarter to a half), long outputs 64-128
    assert take(make_workload("mixed", model_len=512, seed=2), 7) == [
        ("short", 87, 42, (), None), ("long-prompt", 171, 126, (), None),
        ("long-output", 142, 96, (), None), ("long-output", 118, 68, (), None),
        ("long-output", 238, 84, (), None), ("long-prompt", 228, 124, (), None),
        ("long-output", 159, 120, (), None)]
    plans = list(itertools.islice(make_workload("mixed", model_len=65536, seed=2), 3000))
    bounds = {"short": ((64, 256), (32, 128)), "long-prompt": ((4096, 8192), (32, 128)),
              "long-output": ((64, 256), (512, 1024))}
    for cls, ((prompt_low, prompt_high), (output_low, output_high)) in bounds.items():
        prompts = [p.prompt_tokens for p in plans if p.cls == cls]
        outputs = [p.max_tokens for p in plans if p.cls == cls]
        assert prompt_low <= min(prompts) and max(prompts) <= prompt_high
        assert output_low <= min(outputs) and max(outputs) <= output_high


def test_the_shared_context_is_half_the_model_up_to_4096_tokens() -> None:
    wide = make_workload("shared-prefix", model_len=8194, seed=1)
    assert (wide.name, wide.timed, wide.mean_rate) == ("shared-prefix", False, None)
    assert wide.expected_hit_rate == 4096 / (4096 + 72)  # 72: the mean question
    context = ((("shared-context",), 4096),)
    assert take(wide, 3) == [("shared-prefix", 4129, 177, context, None),
                             ("shared-prefix", 4220, 237, context, None),
                             ("shared-prefix", 4209, 48, context, None)]
    assert take(make_workload("shared-prefix", model_len=8192, seed=1), 1) == \
        [("shared-prefix", 4129, 177, context, None)]
    narrow = make_workload("shared-prefix", model_len=8190)
    assert narrow.expected_hit_rate == 4095 / (4095 + 72)
    assert take(narrow, 1) == [("shared-prefix", 4219, 130, ((("shared-context",), 4095),),
                                None)]
    assert take(make_workload("shared-prefix", model_len=None), 1) == [
        ("shared-prefix", 2172, 130, ((("shared-context",), 2048),), None)]


def test_a_trace_is_fitted_to_the_context_output_first(tmp_path: Path) -> None:
    # a 101-token model: outputs up to half of it (50), prompts up to what is left less one
    rows = [(0, 50, 50), (1, 51, 51), (2, 10, 49), (3, 0, 0), (4, 99, 1), (5, 100, 1)]
    trace = make_workload(f"trace:{azure_rows(tmp_path / 'fit.csv', rows)}", model_len=101)
    assert [(p.prompt_tokens, p.max_tokens) for p in itertools.islice(trace, 6)] == [
        (50, 50), (50, 50), (10, 49), (1, 1), (99, 1), (99, 1)]


def test_lengths_are_whole_tokens_at_any_context_length() -> None:
    # an odd context, and ones past the caps: halves and eighths are whole numbers of tokens
    # (a float to random.randint is deprecated, and an error from Python 3.12)
    assert take(make_workload("mixed", model_len=1001, seed=5), 4) == [
        ("long-output", 129, 219, (), None), ("long-prompt", 453, 120, (), None),
        ("long-output", 230, 243, (), None), ("long-output", 71, 232, (), None)]
    shared = make_workload("shared-prefix", model_len=8191, seed=5)
    assert shared.expected_hit_rate == 4095 / (4095 + 72)
    assert take(shared, 1) == [("shared-prefix", 4190, 97, ((("shared-context",), 4095),),
                                None)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for model_len in (1001, 16385, 65537):
            for name in ("mixed", "shared-prefix"):
                plans = list(itertools.islice(make_workload(name, model_len=model_len), 300))
                assert {(type(p.prompt_tokens), type(p.max_tokens)) for p in plans} == {
                    (int, int)}
                assert {type(size) for p in plans for _, size in p.shared} <= {int}


def test_trace_classes_are_by_prompt_length(tmp_path: Path) -> None:
    rows = [(0, 1023, 1), (1, 1024, 1), (2, 4095, 1), (3, 4096, 1)]
    trace = make_workload(f"trace:{azure_rows(tmp_path / 'classes.csv', rows)}",
                          model_len=65536)
    assert [p.cls for p in itertools.islice(trace, 4)] == [
        "trace-short", "trace-medium", "trace-medium", "trace-long"]


@pytest.mark.parametrize(("arrivals", "rate", "mean_rate", "ats"), [
    # one request: a span of at least 1 s, plus one mean gap before the next lap
    ((0.0,), None, 1.0, [0.0, 2.0, 4.0]),
    # half a second apart: still a 1 s span (2 a second), a lap every 1.5 s
    ((0.0, 0.5), None, 2.0, [0.0, 0.5, 1.5, 2.0, 3.0]),
    ((0.0, 1.0), None, 2.0, [0.0, 1.0, 1.5, 2.5, 3.0]),
    ((0.0, 3.0), None, 2 / 3, [0.0, 3.0, 4.5, 7.5, 9.0]),
    # twice the trace's own rate: every arrival twice as early
    ((0.0, 1.0), 4.0, 4.0, [0.0, 0.5, 0.75, 1.25, 1.5]),
])
def test_a_trace_replays_in_laps_one_mean_gap_apart(
        tmp_path: Path, arrivals: tuple[float, ...], rate: float | None, mean_rate: float,
        ats: list[float]) -> None:
    path = azure_rows(tmp_path / "laps.csv", [(t, 10, 5) for t in arrivals])
    trace = make_workload(f"trace:{path}", model_len=100, rate=rate)
    assert (trace.name, trace.timed, trace.expected_hit_rate) == (f"trace:{path}", True, None)
    assert trace.mean_rate == mean_rate
    assert take(trace, len(ats)) == [("trace-short", 10, 5, (), at) for at in ats]


def test_a_trace_that_starts_late_is_replayed_from_its_first_request(tmp_path: Path) -> None:
    path = tmp_path / "late.jsonl"
    path.write_text("".join(json.dumps({"timestamp": ms, "input_length": 10, "output_length": 5,
                                        "hash_ids": []}) + "\n" for ms in (1000, 1500)),
                    encoding="utf-8")
    trace = make_workload(f"trace:{path}", model_len=100)
    assert trace.mean_rate == 2.0  # two requests in its span of (at least) a second
    assert [p.at for p in itertools.islice(trace, 4)] == [0.0, 0.5, 1.5, 2.0]


def test_each_lap_of_a_mooncake_trace_has_prefixes_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"  # as Mooncake publishes it: not gzipped
    path.write_text(json.dumps({"timestamp": 0, "input_length": 1100, "output_length": 5,
                                "hash_ids": [4, 9]}) + "\n", encoding="utf-8")
    assert take(make_workload(f"trace:{path}", model_len=8192), 2) == [
        ("trace-medium", 1100, 5, (((0, 4), 512), ((0, 9), 512)), 0.0),
        ("trace-medium", 1100, 5, (((1, 4), 512), ((1, 9), 512)), 2.0)]


def test_the_named_traces_are_the_shipped_ones() -> None:
    mooncake = make_workload("mooncake", model_len=65536)
    assert (mooncake.name, mooncake.timed) == ("mooncake", True)
    assert mooncake.mean_rate == pytest.approx(12031 / 3536.999)  # its hour, as shipped
    assert take(mooncake, 1) == [("trace-long", 6758, 500,
                                  tuple(((0, h), 512) for h in range(14)), 0.0)]
    azure = make_workload("azure", model_len=65536)
    assert (azure.name, azure.timed) == ("azure", True)
    assert azure.mean_rate == pytest.approx(5.5304, abs=1e-4)
    assert make_workload("azure", model_len=65536, rate=2.0).mean_rate == pytest.approx(2.0)
    assert [(p.prompt_tokens, p.max_tokens, p.shared) for p in itertools.islice(azure, 2)] == [
        (374, 44, ()), (396, 109, ())]


@pytest.mark.parametrize(("name", "file"), [("mooncake", traces.MOONCAKE_FILE),
                                            ("azure", traces.AZURE_FILE)])
def test_a_named_trace_missing_from_the_traces_folder_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, file: str) -> None:
    monkeypatch.setenv(traces.TRACES_ENV, str(tmp_path))
    with pytest.raises(WorkloadError) as refused:
        make_workload(name, model_len=4096)
    assert str(refused.value) == (f"trace {tmp_path / file} not found (from $KVTOP_TRACES_DIR)"
                                  "; or pass --workload trace:FILE")


@pytest.mark.parametrize("name", ["t.jsonl", "t.json", "t.jsonl.gz"])
def test_mooncake_traces_are_known_by_their_ending(tmp_path: Path, name: str) -> None:
    line = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": []})
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(line.encode()))
    else:
        path.write_text(line, encoding="utf-8")
    assert take(make_workload(f"trace:{path}", model_len=100), 1) == [
        ("trace-short", 10, 5, (), 0.0)]


def test_a_trace_in_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    azure_rows(tmp_path / "a.csv", [(0, 10, 5)])
    assert take(make_workload("trace:~/a.csv", model_len=100), 1) == [
        ("trace-short", 10, 5, (), 0.0)]


def test_what_is_not_a_workload_is_refused_with_the_reason(tmp_path: Path) -> None:
    def refusal(spec: str) -> str:
        with pytest.raises(WorkloadError) as refused:
            make_workload(spec, model_len=4096)
        return str(refused.value)

    assert refusal("nonsense") == ("unknown workload 'nonsense': choose mixed, shared-prefix, "
                                   "mooncake, azure or trace:FILE")
    assert refusal(f"trace:{tmp_path}") == f"trace file {tmp_path} not found"
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    assert refusal(f"trace:{tmp_path / 'empty.jsonl'}") == \
        f"trace {tmp_path / 'empty.jsonl'} holds no requests"
    (tmp_path / "bad.csv").write_text("when,what\n1,2\n", encoding="utf-8")
    assert refusal(f"trace:{tmp_path / 'bad.csv'}") == \
        f"cannot read {tmp_path / 'bad.csv'} as an Azure CSV trace: KeyError: 'TIMESTAMP'"
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 0}\n', encoding="utf-8")
    assert refusal(f"trace:{tmp_path / 'bad.jsonl'}") == (
        f"cannot read {tmp_path / 'bad.jsonl'} as a Mooncake JSON Lines trace: "
        "KeyError: 'input_length'")
