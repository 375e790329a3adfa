"""`kvtop compare` in this process (so the mutation runs see it), on a recording of the
simulated server: a replay cut by --since/--until, and the cut refused without a recording.
The rest of its command line (a live run, another baseline, usage errors, its help) is
tested beside `kvtop baseline`'s in tests/unit/commands/test_baseline.py, whose recordings
and runs both commands share."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from benchmarks.baseline_eval.scenarios import HEALTHY, write_recording
from kvtop.cli import main
from kvtop.exits import EXIT_NO_DATA, EXIT_USAGE


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short healthy recording of the simulated server (3 minutes)."""
    return write_recording(HEALTHY.but(minutes=3),
                           tmp_path_factory.mktemp("rec") / "small.jsonl.gz")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_a_replay_is_compared_within_since_and_until(recording: Path, data_home: Path) -> None:
    assert run("baseline", "save", "before", "--from", str(recording))[0] == 0
    code, out, err = run("compare", "before", "--replay", str(recording), "--since", "1m",
                         "--until", "2m", "--json")
    now = json.loads(out)["now"]
    assert code == EXIT_NO_DATA, err  # a minute a side: no verdict
    assert (now["name"], now["source"]) == (None, {
        "kind": "recording", "recording": str(recording), "range": "since +60s until +120s"})


def test_since_and_until_without_a_replay_are_refused_naming_it(
        recording: Path, data_home: Path) -> None:
    assert run("baseline", "save", "before", "--from", str(recording))[0] == 0
    refusal = "kvtop: --since and --until cut a recording: give them with --replay\n"
    for cut in (("--since", "1m"), ("--until", "2m")):
        assert run("compare", "before", "127.0.0.1:1", "--duration", "1s", *cut) == (
            EXIT_USAGE, "", refusal)
