"""`kvtop snapshot --table` as a person reads it: columns padded to their widest cell (in
terminal cells), numbers right-aligned, every GPU with its memory, use and owners, the two
tables one blank line apart on stdout, and what went wrong (a target's whole error, each GPU
source that failed) in notes on stderr."""

from __future__ import annotations

import pytest

from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetState, TargetTracker
from kvtop.safe_text import cells
from kvtop.view.table import ERROR_CELL, aligned, gpu_lines, note_lines, table_lines, table_text
from tests.support.paths import fixture_text

GIB = 2**30
TAKEN_AT = "2026-12-01T12:00:00+00:00"
GPUS = [
    {"index": 0, "name": "H100", "host": "node-a", "owners": [{"label": "vllm-a", "by": "pid"}],
     "memory_used_bytes": 3 * GIB // 2, "memory_total_bytes": 80 * GIB,
     "utilization_percent": 42.6},
    {"index": None, "name": "A100", "host": None, "mig": {"instance": 3},
     "owners": [{"label": "a", "by": "port"}, {"label": "b", "by": "pod"}],
     "memory_used_bytes": None, "memory_total_bytes": 40 * GIB, "utilization_percent": None,
     "source": "dcgm"},
    {"index": 1, "name": "T4", "memory_used_bytes": 0, "memory_total_bytes": 16 * GIB,
     "utilization_percent": 0, "source": "dcgm"},
]
SOURCES = [
    {"source": "nvml", "status": "ok", "target": None, "host": "node-a", "error": None},
    {"source": "dcgm", "status": "error", "target": "exporter", "host": "node-b",
     "error": "connection refused"},
    {"source": "nvml", "status": "unavailable", "target": None, "host": "node-c", "error": None},
    {"source": "nvml", "status": "error", "target": None, "host": None, "error": "no \x1b[2J"},
]


def test_columns_are_padded_to_the_widest_cell_and_numbers_right_aligned() -> None:
    assert aligned(["N", "NAME", "NOTE"], [["10", "a", "x"], ["7", "bbbbb", ""]], right={0}) == [
        " N  NAME   NOTE",
        "10  a      x",
        " 7  bbbbb"]


def test_counts_are_right_aligned_under_their_label_and_names_left_aligned() -> None:
    target = Target.from_spec("127.0.0.1:8000", name="a")
    scrape = read_scrape(Scrape(target, 1.0, fixture_text("vllm-0.33.0-v1-twin-under-load.txt")))
    header, row = table_lines([TargetTracker(target).update(scrape)], 1.0)
    assert row.startswith("a ") and row[header.index("MODEL")] != " "
    for label, value in (("RUN", "30"), ("WAIT", "149")):  # each shorter than its label
        end = header.index(label) + len(label)
        assert row[end - len(value):end] == value and row[end - len(value) - 1] == " "


def test_columns_are_padded_by_terminal_cells_not_characters() -> None:
    # a CJK model name is two cells a character: the next column still lines up
    lines = aligned(["MODEL", "RUN"], [["通义千问", "3"], ["llama", "12"]], right={1})
    assert lines == ["MODEL     RUN", "通义千问    3", "llama      12"]


def test_a_row_with_more_cells_than_the_header_is_refused_not_cut() -> None:
    with pytest.raises(ValueError):
        aligned(["A"], [["x", "lost"]])


def test_every_gpu_with_memory_use_and_owners() -> None:
    assert gpu_lines({"gpus": GPUS, "gpu_sources": SOURCES}) == [
        "HOST    GPU           MEMORY GiB  UTIL  SERVERS            SOURCE",
        "node-a  0 H100          1.5/80.0   43%  vllm-a (pid)       nvml",
        "–       ? A100 MIG 3      –/40.0     –  a (port), b (pod)  dcgm",
        "–       1 T4            0.0/16.0    0%  –                  dcgm"]


DOWN = TargetState(Target.from_spec("10.0.0.6:8000"), "down", failure="down",
                   error="connection refused: " + "a very long reason " * 12)


def test_what_went_wrong_is_a_note_the_row_says_it_in_a_few_words() -> None:
    # a GPU source that failed and a down target's whole error; no GPU here is no news
    assert note_lines([DOWN], {"gpu_sources": SOURCES}) == [
        f"10.0.0.6:8000: {DOWN.error}",
        "GPUs from dcgm exporter: connection refused",
        "GPUs from nvml : no \\x1b[2J"]  # a server's text never reaches the terminal raw
    header, row = table_lines([DOWN], 0.0)
    model = row[header.index("MODEL"):header.index("STATUS")].strip()
    assert len(model) == ERROR_CELL and model.startswith("connection refused") and (
        model.endswith("…"))  # one down target does not make every row 260 columns


def test_no_gpus_and_no_sources_is_no_lines() -> None:
    assert gpu_lines({}) == []
    assert gpu_lines({"gpus": [], "gpu_sources": SOURCES[:1]}) == []


def test_the_table_is_the_targets_then_a_blank_line_then_the_gpus() -> None:
    text = table_text([], {"taken_at": TAKEN_AT, "gpus": GPUS[:1]})
    header = table_lines([], 0.0)
    assert text == "\n".join([*header, "", *gpu_lines({"gpus": GPUS[:1]})]) + "\n"
    assert len(header) == 1  # no targets, no rows


def test_without_gpus_the_table_ends_after_the_targets_with_no_note_in_it() -> None:
    text = table_text([DOWN], {"taken_at": TAKEN_AT, "gpu_sources": SOURCES})
    assert text == "\n".join(table_lines([DOWN], 0.0)) + "\n"  # no blank, no note: stderr's


def test_columns_line_up_in_terminal_cells_whatever_the_script() -> None:
    """A CJK name takes two cells per character: padded by characters, its row shifted
    (by 20 cells for a 20-character name)."""
    lines = aligned(["NAME", "N"], [["模型" * 10, "1"], ["llama", "2"]], right={1})
    assert [cells(line) for line in lines] == [43, 43, 43]
    assert [cells(line[: line.rindex(last)]) for line, last in zip(lines, "N12", strict=True)
            ] == [42] * 3
