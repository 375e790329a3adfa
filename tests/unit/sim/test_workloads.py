"""Synthetic workloads and trace replay."""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import random
import sys
from pathlib import Path

import pytest

from kvtop.sim import workloads
from kvtop.sim.engine import EngineConfig, RequestSpec
from kvtop.sim.simulation import Simulation
from kvtop.sim.workloads import SyntheticSpec, make_workload, synthetic
from tests.support.paths import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def take(it: object, n: int) -> list:
    return list(itertools.islice(it, n))  # type: ignore[call-overload]


def test_synthetic_is_seeded_sorted_and_near_its_rate() -> None:
    a = take(synthetic(seed=3), 2000)
    assert a == take(synthetic(seed=3), 2000)
    assert a != take(synthetic(seed=4), 2000)
    times = [r.arrival for r in a]
    assert times == sorted(times)
    assert 2000 / times[-1] == pytest.approx(SyntheticSpec().rate, rel=0.1)


def test_synthetic_groups_share_system_prompt_blocks() -> None:
    spec = SyntheticSpec(groups=2, system_prompt_len=256, shared_frac=1.0)
    reqs = take(synthetic(spec), 50)
    assert {len(r.prefix_keys) for r in reqs} == {16}
    assert len({r.prefix_keys for r in reqs}) == 2
    assert all(r.prompt_len > 256 for r in reqs)


def test_bursty_arrivals_come_in_bursts_with_the_same_mean() -> None:
    spec = SyntheticSpec(arrival="bursty", rate=4.0, burst_factor=4.0, burst_len=10.0)
    times = [r.arrival for r in take(synthetic(spec), 4000)]
    assert 4000 / times[-1] == pytest.approx(4.0, rel=0.1)
    quiet = sum(1 for t in times if 10.0 < t % 40.0 < 40.0)
    assert quiet == 0


def test_the_samples_ship_inside_the_package() -> None:
    # pyproject's package-data must take every file of kvtop/sim/traces into the wheel
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["kvtop"]
    package = REPO / "kvtop"
    shipped = {p for pattern in globs for p in package.glob(pattern)}
    assert set(workloads.SHIPPED_DIR.iterdir()) <= shipped
    assert workloads.trace_path(workloads.MOONCAKE_FILE, workloads.MOONCAKE_SHIPPED) == \
        workloads.SHIPPED_DIR / workloads.MOONCAKE_SHIPPED
    licences = {p.name for p in workloads.SHIPPED_DIR.glob("LICENSE-*")}
    assert licences == {"LICENSE-Mooncake-Apache-2.0.txt",
                        "LICENSE-AzurePublicDataset-CC-BY-4.0.txt"}


def test_the_whole_hour_of_each_trace_ships() -> None:
    # benchmarks/leak_eval's published numbers were measured on the whole hour (README there)
    mooncake = workloads.load_mooncake(workloads.SHIPPED_DIR / workloads.MOONCAKE_SHIPPED)
    azure = workloads.load_azure(workloads.SHIPPED_DIR / workloads.AZURE_SHIPPED)
    assert (len(mooncake), len(azure)) == (12031, 19366)
    assert mooncake[-1].arrival == pytest.approx(3536.999)
    assert azure[-1].arrival == pytest.approx(3501.72, abs=0.01)


def test_a_mooncake_trace_reads_the_same_gzipped_or_plain(tmp_path: Path) -> None:
    # Mooncake publishes conversation_trace.jsonl uncompressed; docs/rehearse.md replays it
    shipped = workloads.SHIPPED_DIR / workloads.MOONCAKE_SHIPPED
    plain = tmp_path / "conversation_trace.jsonl"
    plain.write_bytes(b"".join(gzip.decompress(shipped.read_bytes()).splitlines(True)[:3]))
    assert workloads.load_mooncake(plain) == workloads.load_mooncake(shipped)[:3]


def test_traces_dir_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A trace under its source name (here: the first rows of the shipped Azure one) wins.
    rows = gzip.decompress((workloads.SHIPPED_DIR / workloads.AZURE_SHIPPED).read_bytes())
    lines = rows.splitlines(keepends=True)
    (tmp_path / workloads.AZURE_FILE).write_bytes(b"".join(lines[:3]))
    monkeypatch.setenv(workloads.TRACES_ENV, str(tmp_path))
    assert len(take(workloads.azure(), 5)) == 5  # two rows, looped
    assert [r.prompt_len for r in take(workloads.azure(), 4)] == [374, 396, 374, 396]
    with pytest.raises(FileNotFoundError, match=workloads.TRACES_ENV):
        next(make_workload("mooncake"))
    with pytest.raises(ValueError):
        make_workload("nope")


def test_mooncake_maps_512_token_hashes_to_16_token_blocks() -> None:
    reqs = take(workloads.mooncake(token_scale=1.0, spread=False), 3)
    first, second = reqs[0], reqs[1]
    assert first.prompt_len == 6758 and len(first.prefix_keys) == 6758 // 16
    # Both start with hash id 0: exactly its 32 blocks of 16 are shared.
    shared = sum(1 for a, b in zip(first.prefix_keys, second.prefix_keys, strict=False)
                 if a == b)
    assert shared == 32
    scaled = take(workloads.mooncake(token_scale=0.125, spread=False), 1)[0]
    # At 1/8 scale a 512-token hash id covers 64 tokens: 4 blocks of 16.
    assert scaled.prompt_len == round(6758 / 8)
    assert [k[3:] for k in scaled.prefix_keys[:6]] == [(0, 0), (0, 1), (0, 2), (0, 3),
                                                        (1, 0), (1, 1)]


def test_mooncake_spread_and_subsample_keep_order() -> None:
    full = take(workloads.mooncake(), 3000)
    half = take(workloads.mooncake(rate_scale=0.5), 1500)
    times = [r.arrival for r in full]
    assert times == sorted(times)
    assert half[-1].arrival == pytest.approx(full[-1].arrival, rel=0.15)


def test_azure_replays_arrivals_and_lengths() -> None:
    reqs = take(workloads.azure(), 2)
    assert (reqs[0].arrival, reqs[0].prompt_len, reqs[0].output_len) == (0.0, 374, 44)
    assert reqs[1].arrival == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    fast = take(workloads.azure(rate_scale=2.0), 2)
    assert fast[1].arrival == pytest.approx(reqs[1].arrival / 2)


@pytest.mark.parametrize("kind", ["mooncake", "azure"])
def test_trace_replay_drives_a_simulation(kind: str) -> None:
    sim = Simulation(EngineConfig(), make_workload(kind))
    sim.advance_to(60.0)
    truth = sim.truth()
    assert sum(truth.finished.values()) > 20 and truth.steps > 100
    if kind == "mooncake":
        assert truth.prefix_hits > 0  # the shared first block at least


# --- pinned seeds, exact values, and the raw traces read on their own ---------------------------

def test_trace_path_is_the_folder_given_then_the_environments_then_the_shipped_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(workloads.TRACES_ENV, raising=False)
    shipped = workloads.SHIPPED_DIR / workloads.AZURE_SHIPPED
    assert workloads.trace_path(workloads.AZURE_FILE, workloads.AZURE_SHIPPED) == shipped
    (tmp_path / "given").mkdir()
    (tmp_path / "given" / "t.csv").write_text("x")
    (tmp_path / "home" / "traces").mkdir(parents=True)
    (tmp_path / "home" / "traces" / "t.csv").write_text("x")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(workloads.TRACES_ENV, "~/traces")  # a user's ~ is expanded
    assert workloads.trace_path("t.csv", "s.csv") == tmp_path / "home" / "traces" / "t.csv"
    assert workloads.trace_path("t.csv", "s.csv", tmp_path / "given") == \
        tmp_path / "given" / "t.csv"
    missing = tmp_path / "home" / "traces" / "u.csv"
    with pytest.raises(FileNotFoundError) as env_error:
        workloads.trace_path("u.csv", "s.csv")
    assert str(env_error.value) == f"trace {missing} not found (from $KVTOP_TRACES_DIR)"
    with pytest.raises(FileNotFoundError) as given_error:
        workloads.trace_path("u.csv", "s.csv", tmp_path / "given")
    assert str(given_error.value) == f"trace {tmp_path / 'given' / 'u.csv'} not found"
    monkeypatch.delenv(workloads.TRACES_ENV)
    with pytest.raises(FileNotFoundError) as shipped_error:
        workloads.trace_path("t.csv", "s.csv")
    assert str(shipped_error.value) == f"trace {workloads.SHIPPED_DIR / 's.csv'} not found"


def test_synthetic_requests_of_a_seed_are_pinned() -> None:
    system = tuple(("sys", 7, 3, j) for j in range(32))  # group 3 of 4, 512 tokens
    assert take(synthetic(seed=7), 3) == [
        RequestSpec(arrival=0.048914355529350535, prompt_len=966, max_tokens=250,
                    output_len=157, prefix_keys=system),
        RequestSpec(arrival=0.11661193899675829, prompt_len=903, max_tokens=1327,
                    output_len=802, prefix_keys=system),
        RequestSpec(arrival=0.12296957476026196, prompt_len=909, max_tokens=365,
                    output_len=114, prefix_keys=tuple(("sys", 7, 0, j) for j in range(32))),
    ]
    spec = SyntheticSpec(arrival="bursty", rate=2.0, burst_factor=2.0, burst_len=1.0,
                         abort_frac=0.5, groups=2, system_prompt_len=32)
    # the same draws: a burst at 4/s doubles the 8/s gaps above; 32 tokens are 2 blocks
    assert take(synthetic(spec, seed=7), 4) == [
        RequestSpec(0.09782871105870107, 486, 250, 157, (("sys", 7, 1, 0), ("sys", 7, 1, 1))),
        RequestSpec(0.23322387799351657, 423, 1327, 802,
                    (("sys", 7, 1, 0), ("sys", 7, 1, 1))),
        RequestSpec(0.24593914952052393, 429, 365, 114, (("sys", 7, 0, 0), ("sys", 7, 0, 1))),
        RequestSpec(0.4637685888690696, 247, 122, 41, (), abort_after=5.0),
    ]


def test_lengths_are_lognormal_around_their_means_and_clamped_to_their_limits() -> None:
    reqs = take(synthetic(SyntheticSpec(shared_frac=0.0, eos_frac=0.0), seed=1), 20000)
    # sigma 0.8: the mean of the draws, not their median, is the spec's (2 % at this count)
    assert sum(r.prompt_len for r in reqs) / len(reqs) == pytest.approx(500.0, rel=0.02)
    assert sum(r.output_len for r in reqs) / len(reqs) == pytest.approx(200.0, rel=0.02)
    assert all(r.max_tokens == r.output_len and r.prefix_keys == () for r in reqs)
    # the tails reach the default limits (8000 prompt, 2000 output tokens) and stop there
    assert (max(r.prompt_len for r in reqs), max(r.output_len for r in reqs)) == (8000, 2000)
    tiny = take(synthetic(SyntheticSpec(prompt_mean=0.01, output_mean=0.01), seed=1), 50)
    assert {(r.prompt_len - len(r.prefix_keys) * 16, r.output_len) for r in tiny} == {(1, 1)}
    huge = SyntheticSpec(prompt_mean=1e9, output_mean=1e9, max_prompt=700, max_output=90,
                         shared_frac=0.0, eos_frac=0.0)
    assert {(r.prompt_len, r.max_tokens) for r in take(synthetic(huge), 50)} == {(700, 90)}


def test_an_eos_request_may_run_one_and_a_half_to_four_times_its_output() -> None:
    reqs = take(synthetic(SyntheticSpec(eos_frac=1.0), seed=2), 3000)
    ratios = [r.max_tokens / r.output_len for r in reqs if r.output_len >= 200]
    assert 1.5 <= min(ratios) < 1.55 and 3.95 < max(ratios) <= 4.0


def test_groups_share_prompts_only_where_there_are_groups_and_the_fraction_says() -> None:
    none = take(synthetic(SyntheticSpec(groups=0, shared_frac=1.0), seed=1), 200)
    assert {r.prefix_keys for r in none} == {()}
    assert all(r.prompt_len <= SyntheticSpec().max_prompt for r in none)
    blocks32 = take(synthetic(SyntheticSpec(shared_frac=1.0), seed=1, block_size=32), 200)
    assert {len(r.prefix_keys) for r in blocks32} == {512 // 32}
    half = take(synthetic(SyntheticSpec(shared_frac=0.5), seed=1), 4000)
    assert sum(bool(r.prefix_keys) for r in half) / 4000 == pytest.approx(0.5, abs=0.03)


def test_aborting_clients_are_the_fraction_given_and_wait_the_time_given() -> None:
    spec = SyntheticSpec(abort_frac=0.25, abort_after=2.5)
    reqs = take(synthetic(spec, seed=1), 4000)
    assert {r.abort_after for r in reqs} == {None, 2.5}
    assert sum(r.abort_after is not None for r in reqs) / 4000 == pytest.approx(0.25, abs=0.03)


def test_bursts_last_their_length_and_the_quiet_keeps_the_mean() -> None:
    spec = SyntheticSpec(arrival="bursty", rate=2.0, burst_factor=3.0, burst_len=5.0)
    times = [r.arrival for r in take(synthetic(spec, seed=4), 6000)]
    # bursts of 5 s at 6/s, then 10 s of quiet: one 15 s period
    assert all(t % 15.0 < 5.0 for t in times)
    assert max(t % 15.0 for t in times) > 4.9
    assert 6000 / times[-1] == pytest.approx(2.0, rel=0.05)


@functools.lru_cache(maxsize=1)  # the raw file, read without kvtop: no mutant can touch it
def raw_mooncake() -> tuple[dict, ...]:
    with gzip.open(workloads.SHIPPED_DIR / workloads.MOONCAKE_SHIPPED, "rt") as f:
        return tuple(json.loads(line) for line in f)


def test_mooncake_rows_are_the_trace_in_seconds() -> None:
    raw = raw_mooncake()
    rows = workloads.load_mooncake(workloads.SHIPPED_DIR / workloads.MOONCAKE_SHIPPED)
    assert [(r.arrival, r.prompt_len, r.output_len, r.hash_ids) for r in rows] == [
        (r["timestamp"] / 1000, r["input_length"], r["output_length"], tuple(r["hash_ids"]))
        for r in raw]


def test_mooncake_replay_spreads_each_bucket_over_its_three_seconds() -> None:
    raw = raw_mooncake()
    first = sum(r["timestamp"] == 0 for r in raw)  # 10 requests stamped 0 ms
    reqs = take(workloads.mooncake(), first + 1)
    assert [r.arrival for r in reqs[:first]] == [3.0 * k / first for k in range(first)]
    assert reqs[first].arrival == raw[first]["timestamp"] / 1000  # the next bucket's first
    fast = take(workloads.mooncake(rate_scale=2.0), first)
    assert [r.arrival for r in fast] == [1.5 * k / first for k in range(first)]


def test_mooncake_requests_are_the_rows_scaled_with_their_shared_blocks() -> None:
    raw = raw_mooncake()[:3]
    reqs = take(workloads.mooncake(spread=False, seed=5, token_scale=0.25, max_tokens=600), 3)
    for req, row in zip(reqs, raw, strict=True):
        prompt = round(row["input_length"] * 0.25)
        keys = [("mc", 5, 0, h, j) for h in row["hash_ids"] for j in range(8)]  # 128 tokens
        assert req == RequestSpec(0.0, prompt, max(row["output_length"], 600),
                                  row["output_length"], tuple(keys[:prompt // 16]))
    # a hash id worth less than a block still gives one key; a prompt never shrinks to 0
    tiny = take(workloads.mooncake(spread=False, token_scale=0.0001), 1)[0]
    assert (tiny.prompt_len, tiny.prefix_keys) == (1, ())
    small = take(workloads.mooncake(spread=False, token_scale=0.01, block_size=4), 1)[0]
    assert small.prompt_len == 68 and small.prefix_keys[:2] == (("mc", 0, 0, 0, 0),
                                                                 ("mc", 0, 0, 1, 0))


def write_azure(folder: Path, lines: list[str]) -> None:
    (folder / workloads.AZURE_FILE).write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{x}\n" for x in lines))


def test_azure_rows_are_sorted_and_timed_from_the_first_across_midnight(tmp_path: Path) -> None:
    write_azure(tmp_path, ["2023-11-17 00:00:01.5000000,30,3",
                           "2023-11-16 23:59:59.2500000,10,1",
                           "2023-11-17 00:00:00.0000001,20,2"])
    reqs = take(workloads.azure(directory=tmp_path, max_tokens=2), 4)
    assert [(r.prompt_len, r.max_tokens, r.output_len) for r in reqs] == [
        (10, 2, 1), (20, 2, 2), (30, 3, 3), (10, 2, 1)]
    assert [r.arrival for r in reqs[:3]] == pytest.approx([0.0, 0.7500001, 2.25], abs=1e-9)
    # the second lap starts 3 s after the last arrival
    assert reqs[3].arrival == pytest.approx(2.25 + 3.0, abs=1e-9)
    assert workloads._azure_seconds("2023-01-02 01:02:03.5000000") == 86400 + 3723.5


def test_an_azure_trace_of_a_header_alone_holds_no_requests(tmp_path: Path) -> None:
    """No rows is no requests (its reader says so), not a crash on the first arrival."""
    write_azure(tmp_path, [])
    assert workloads.load_azure(tmp_path / workloads.AZURE_FILE) == ()


def test_azure_lays_system_prompts_over_the_trace_and_scales_it(tmp_path: Path) -> None:
    write_azure(tmp_path, ["2023-11-16 18:15:46.0000000,10,1",
                           "2023-11-16 18:15:48.0000000,400,2"])
    reqs = take(workloads.azure(directory=tmp_path, groups=2, system_prompt_len=64, seed=3,
                                token_scale=0.5, rate_scale=4.0), 4)
    # a prompt shorter than its system prompt grows to hold it and one token more
    assert [r.prompt_len for r in reqs] == [65, 200, 65, 200]
    # at full rate the replay draws nothing: the seed's draws all go to the groups, in order
    draws = random.Random(3)
    groups = [draws.choice(range(2)) for _ in range(4)]
    assert [r.prefix_keys for r in reqs] == [tuple(("az", 3, g, j) for j in range(4))
                                             for g in groups]
    assert [r.arrival for r in reqs] == [0.0, 0.5, 1.25, 1.75]  # 4x faster, 5 s a lap
    half = take(workloads.azure(directory=tmp_path, rate_scale=0.5, seed=1), 40)
    laps = half[-1].arrival // 5.0 + 1
    assert len(half) / (2 * laps) == pytest.approx(0.5, abs=0.15)


def test_make_workload_passes_its_seed_block_size_and_params() -> None:
    assert list(make_workload("none")) == []
    assert take(make_workload("synthetic", seed=7, rate=8.0), 3) == take(synthetic(seed=7), 3)
    assert take(make_workload("synthetic", seed=2, block_size=32, groups=1,
                              shared_frac=1.0), 1)[0].prefix_keys == tuple(
        ("sys", 2, 0, j) for j in range(16))
    assert take(make_workload("mooncake", seed=4, block_size=8, spread=False), 2) == take(
        workloads.mooncake(seed=4, block_size=8, spread=False), 2)
    assert take(make_workload("azure", seed=4, block_size=8, groups=2,
                              system_prompt_len=64), 3) == take(
        workloads.azure(seed=4, block_size=8, groups=2, system_prompt_len=64), 3)
    with pytest.raises(ValueError) as error:
        make_workload("tgi")
    assert str(error.value) == "unknown workload 'tgi'; choose from synthetic, mooncake, " \
                               "azure, none"


def test_each_workloads_defaults_are_seed_0_blocks_of_16_and_2048_tokens_at_most() -> None:
    first = take(synthetic(), 20)
    assert first == take(make_workload("synthetic"), 20)
    shared = next(r.prefix_keys for r in first if r.prefix_keys)
    assert {key[:2] for key in shared} == {("sys", 0)} and len(shared) == 32
    raw = raw_mooncake()[0]
    prompt = round(raw["input_length"] / 8)  # 1/8 of the tokens: 64 a hash id, 4 blocks
    assert take(workloads.mooncake(spread=False), 1)[0] == RequestSpec(
        0.0, prompt, 2048, raw["output_length"],
        tuple(("mc", 0, 0, h, j) for h in raw["hash_ids"] for j in range(4))[:prompt // 16])
    assert take(workloads.azure(), 1)[0] == RequestSpec(0.0, 374, 2048, 44, ())


def test_a_subsampled_replay_keeps_the_rows_its_seeds_draws_keep() -> None:
    rows = workloads.load_azure(workloads.SHIPPED_DIR / workloads.AZURE_SHIPPED)
    draws = random.Random(0)
    kept = [row for row in rows[:40] if draws.random() < 0.5]
    half = take(workloads.azure(rate_scale=0.5), len(kept))  # the default seed, 0
    assert [(r.arrival, r.prompt_len, r.output_len) for r in half] == [
        (row.arrival, row.prompt_len, row.output_len) for row in kept]
    assert take(workloads.mooncake(rate_scale=0.5, seed=2), 40) == take(
        workloads.mooncake(rate_scale=0.5, seed=2), 40)  # a seed repeats its subsample
    assert take(workloads.mooncake(rate_scale=0.5, seed=2), 40) != take(
        workloads.mooncake(rate_scale=0.5, seed=3), 40)


def test_mooncake_reads_a_trace_from_the_folder_given_blank_lines_aside(tmp_path: Path) -> None:
    lines = ['{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [7]}', "",
             '{"timestamp": 1500, "input_length": 20, "output_length": 3, "hash_ids": [8]}']
    with gzip.open(tmp_path / workloads.MOONCAKE_FILE, "wt") as f:
        f.write("\n".join(lines) + "\n")
    reqs = take(workloads.mooncake(directory=tmp_path, spread=False, token_scale=1.0,
                                   max_tokens=4), 3)
    keys = tuple(("mc", 0, 0, 7, j) for j in range(2))  # 40 tokens: 2 of the 32 blocks
    assert reqs == [RequestSpec(0.0, 40, 5, 5, keys), RequestSpec(1.5, 20, 4, 3,
                                                                  (("mc", 0, 0, 8, 0),)),
                    RequestSpec(4.5, 40, 5, 5, tuple(("mc", 0, 1, 7, j) for j in range(2)))]


def test_an_azure_prompt_never_scales_below_one_token(tmp_path: Path) -> None:
    write_azure(tmp_path, ["2023-11-16 18:15:46.0000000,10,1"])
    assert take(workloads.azure(directory=tmp_path, token_scale=0.01), 1)[0].prompt_len == 1


def test_synthetic_defaults_are_bursts_of_10_s_at_four_times_the_rate_and_80_percent_eos() -> None:
    reqs = take(synthetic(SyntheticSpec(arrival="bursty"), seed=5), 8000)
    times = [r.arrival for r in reqs]
    # bursts of 10 s at 32/s, then 30 s of quiet: one 40 s period, 8/s on average
    assert all(t % 40.0 < 10.0 for t in times) and max(t % 40.0 for t in times) > 9.9
    assert 8000 / times[-1] == pytest.approx(8.0, rel=0.05)
    eos = sum(r.max_tokens > r.output_len for r in reqs) / len(reqs)
    assert eos == pytest.approx(0.8, abs=0.02)
