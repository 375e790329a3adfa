"""The header's second line at 80 columns: the fleet's load, hit rate and tokens/s stay;
the view's settings go first, and a GPU that can't be read is a note that goes before any
of them."""

from __future__ import annotations

from kvtop.ui.widgets.summary import _fit, _load_parts, _with_note
from kvtop.view.fleet_summary import FleetSummary

SUMMARY = FleetSummary(hosts_up=4, hosts_total=4, blocks_used=771, blocks_total=7996,
                       running=11, waiting=1, hit_rate=0.76, prompt_tps=12_200.0,
                       generation_tps=2060.0)
SETTINGS = [(4, [("every ", "key"), ("1s", "")]), (3, [("sort ", "key"), ("name ▲", "")])]
NVML = ("no NVML", "NVML: NVML Shared Library Not Found")


def _line(parts: list) -> str:
    return "  ".join("".join(piece for piece, _ in pieces) for _, pieces in parts)


def test_at_80_columns_a_missing_gpu_never_pushes_the_fleet_s_numbers_off() -> None:
    line = _line(_with_note([*_load_parts(SUMMARY), *SETTINGS], NVML, 78))
    assert line == "run 11  wait 1  hit 76%  tok/s 12.2k in 2060 out  every 1s  sort name ▲"
    # the settings fit with nothing to spare: the note, short or long, is the first to go
    assert "GPU" not in line


def test_the_gpu_note_is_short_where_it_fits_and_whole_where_there_is_room() -> None:
    parts = [*_load_parts(SUMMARY), *SETTINGS]
    width = len(_line(parts)) + len("  GPU no NVML")
    assert _line(_with_note(parts, NVML, width)).endswith("  GPU no NVML")
    assert "GPU" not in _line(_with_note(parts, NVML, width - 1))  # a hair narrower: none
    assert _line(_with_note(parts, NVML, 200)).endswith("GPU NVML: NVML Shared Library Not Found")


def test_settings_go_before_the_fleet_s_load() -> None:
    parts = [*_load_parts(SUMMARY), *SETTINGS]
    assert _line(_fit(parts, 50)) == "run 11  wait 1  hit 76%  tok/s 12.2k in 2060 out"
