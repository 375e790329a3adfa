"""Synthetic workloads and trace replay."""

from __future__ import annotations

import gzip
import itertools
import sys
from pathlib import Path

import pytest

from kvtop.sim import workloads
from kvtop.sim.engine import EngineConfig
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
