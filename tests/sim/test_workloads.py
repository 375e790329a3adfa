"""Synthetic workloads and trace replay."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from kvtop.sim import workloads
from kvtop.sim.engine import EngineConfig
from kvtop.sim.simulation import Simulation
from kvtop.sim.workloads import SyntheticSpec, make_workload, synthetic


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


def test_traces_dir_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(workloads.TRACES_ENV, str(tmp_path))
    assert workloads.traces_dir() == tmp_path
    with pytest.raises(FileNotFoundError):
        next(make_workload("mooncake"))
    monkeypatch.setenv(workloads.TRACES_ENV, str(tmp_path / "absent"))
    assert workloads.traces_dir() is None
    with pytest.raises(ValueError):
        make_workload("nope")


def need_traces() -> Path:
    directory = workloads.traces_dir()
    if directory is None:
        pytest.skip("traces not found (clone next to ../shared or set KVTOP_TRACES_DIR)")
    return directory


def test_mooncake_maps_512_token_hashes_to_16_token_blocks() -> None:
    need_traces()
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
    need_traces()
    full = take(workloads.mooncake(), 3000)
    half = take(workloads.mooncake(rate_scale=0.5), 1500)
    times = [r.arrival for r in full]
    assert times == sorted(times)
    assert half[-1].arrival == pytest.approx(full[-1].arrival, rel=0.15)


def test_azure_replays_arrivals_and_lengths() -> None:
    need_traces()
    reqs = take(workloads.azure(), 2)
    assert (reqs[0].arrival, reqs[0].prompt_len, reqs[0].output_len) == (0.0, 374, 44)
    assert reqs[1].arrival == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    fast = take(workloads.azure(rate_scale=2.0), 2)
    assert fast[1].arrival == pytest.approx(reqs[1].arrival / 2)


@pytest.mark.parametrize("kind", ["mooncake", "azure"])
def test_trace_replay_drives_a_simulation(kind: str) -> None:
    need_traces()
    sim = Simulation(EngineConfig(), make_workload(kind))
    sim.advance_to(60.0)
    truth = sim.truth()
    assert sum(truth.finished.values()) > 20 and truth.steps > 100
    if kind == "mooncake":
        assert truth.prefix_hits > 0  # the shared first block at least
