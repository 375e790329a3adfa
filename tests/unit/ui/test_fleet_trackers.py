"""The app's collection model: a tracker per target and per server found later, whether a
scrape is its target's first, the baseline overlay fed every good scrape once it is folded
(never a failed one, nor one older than what was folded), and a rewind that starts afresh."""

from __future__ import annotations

from kvtop.baseline.overlay import BaselineOverlay
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from kvtop.store.recording import read_recording
from kvtop.ui.fleet_trackers import FleetTrackers
from tests.scenarios.app import HOST_A, HOST_B, T0, UNDER_LOAD
from tests.scenarios.baseline_runs import Recordings, summarise
from tests.support.paths import fixture_text

KEY = ("sim-llama-3-8b", "0")  # the simulated server's engine in the baseline runs


def test_a_target_s_first_scrape_is_told_and_a_server_found_later_gets_a_tracker() -> None:
    fleet = FleetTrackers(TargetTracker, [HOST_A, HOST_B], None)
    body = fixture_text(UNDER_LOAD)
    assert [s.status for s in fleet.states()] == ["pending", "pending"]
    tracker, first = fleet.fold(read_scrape(Scrape(HOST_B, T0, body)))
    assert first and tracker is fleet.by_url[HOST_B.url] and tracker.state.status == "up"
    assert fleet.fold(read_scrape(Scrape(HOST_B, T0 + 1, body)))[1] is False
    assert fleet.fold(Scrape(HOST_A, T0, failure="down", error="refused"))[1] is True
    late = Target.from_spec("10.0.0.9:8000")  # e.g. Prometheus found a new instance
    tracker, first = fleet.fold(read_scrape(Scrape(late, T0, body)))
    assert first and [s.target for s in fleet.states()] == [HOST_A, HOST_B, late]


def test_the_overlay_sees_each_good_scrape_once_and_a_rewind_starts_afresh(
        recordings: Recordings) -> None:
    path = recordings.path("healthy")
    overlay = BaselineOverlay({}, summarise(path, "healthy"))
    recording = read_recording(path)
    [target] = recording.targets()
    fleet = FleetTrackers(TargetTracker, [target], overlay)
    for scrape in recording.scrapes[:20]:
        fleet.fold(read_scrape(scrape))
    seen = overlay.delta(target.url, KEY)
    assert seen is not None
    fleet.fold(Scrape(target, recording.scrapes[19].t + 1, failure="down", error="refused"))
    fleet.fold(read_scrape(recording.scrapes[5]))  # older than one folded: the tracker drops it
    assert overlay.delta(target.url, KEY) is seen  # the same window: nothing was added
    fleet.fold(read_scrape(recording.scrapes[20]))
    assert overlay.delta(target.url, KEY) is not seen
    first = fleet.by_url[target.url]
    fleet.reset()
    assert fleet.by_url[target.url] is not first
    assert fleet.states()[0].status == "pending"
    assert overlay.delta(target.url, KEY) is None  # the windows went with the trackers


def test_a_rewind_without_a_baseline_starts_afresh_too() -> None:
    fleet = FleetTrackers(TargetTracker, [HOST_A], None)
    first = fleet.fold(read_scrape(Scrape(HOST_A, T0, fixture_text(UNDER_LOAD))))[0]
    fleet.reset()
    assert fleet.by_url[HOST_A.url] is not first
    assert fleet.fold(read_scrape(Scrape(HOST_A, T0, fixture_text(UNDER_LOAD))))[1] is True
