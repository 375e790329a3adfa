"""The rehearsal's progress line after the load: it says it is draining (how many are in
flight, for how long at most), then that it waits for the server to go idle; it never stands
still without saying why."""

from __future__ import annotations

import io

from kvtop.load.driver import RunClock
from kvtop.rehearse.progress import Progress


class FixedClock(RunClock):
    def __init__(self, t: float) -> None:
        super().__init__()
        self.t = t

    def now(self) -> float:
        return self.t


def test_after_the_load_the_line_says_what_the_run_waits_for() -> None:
    clock = FixedClock(3600.0)
    progress = Progress(io.StringIO(), clock, 3600.0, None, lambda: 0.5, dict)
    assert progress.line().startswith("1:00:00 / 1:00:00 | KV 50%")
    in_flight = [8]
    progress.drain(3600.0 + 70.0, lambda: in_flight[0])
    assert progress.line().startswith(
        "load done (1:00:00); draining 8 in flight, 0:01:10 at most | KV 50%")
    clock.t, in_flight[0] = 3650.0, 3
    assert progress.line().startswith("load done (1:00:00); draining 3 in flight, 0:00:20 at most")
    clock.t = 3700.0  # past the deadline: never a negative wait
    assert "0:00:00 at most" in progress.line()
    progress.settle()
    assert progress.line().startswith(
        "load done; waiting for the server to go idle for the last reading | KV 50%")
