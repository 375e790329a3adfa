"""Workloads: the lengths asked for, shared where they should be."""

from __future__ import annotations

import gzip
import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from kvtop.load.workloads import WorkloadError, make_workload


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
