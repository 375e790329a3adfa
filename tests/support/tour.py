"""docs/tour.md's steps as data: the tmux tier replays them on the real command, and
scripts/screenshots.py --tour drives the demo through them to draw the tour's pictures.

A step is an HTML comment in the tour (invisible where it is rendered), one per line:

    <!-- tour: start --demo -->           kvtop's arguments, in an 80x24 terminal
    <!-- tour: press j -->                keys as tmux names them (Enter, Escape, F6, Down, /)
    <!-- tour: type prefix -->            text typed
    <!-- tour: see hosts 4/4 up -->       text on the screen within a deadline
    <!-- tour: wait 180 LEAK 1 -->        the same, with a deadline of its own (seconds)
    <!-- tour: pause 20 -->               let the demo run that many seconds
    <!-- tour: shot tour-fleet -->        a picture for the tour (the test skips it)
    <!-- tour: quit -->                   q; kvtop exits 0
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TOUR = Path(__file__).resolve().parents[2] / "docs" / "tour.md"
STEP = re.compile(r"<!-- tour: (\w+)(?: (.*?))? -->")
ACTIONS = frozenset({"start", "press", "type", "see", "wait", "pause", "shot", "quit"})
SEE_DEADLINE_S = 20.0
# tmux key names -> Textual's (Pilot)
PILOT_KEYS = {"Enter": "enter", "Escape": "escape", "Down": "down", "Up": "up", "/": "slash",
              "?": "question_mark", "F1": "f1", "F5": "f5", "F6": "f6", "Tab": "tab"}


@dataclass(frozen=True)
class Step:
    action: str
    argument: str = ""
    line: int = 0  # in the tour, for a failure's message

    @property
    def deadline_s(self) -> float:
        return float(self.argument.split()[0]) if self.action == "wait" else SEE_DEADLINE_S

    @property
    def seconds(self) -> float:
        """How long a ``pause`` step lets the demo run."""
        return float(self.argument)

    @property
    def text(self) -> str:
        """What a ``see`` or ``wait`` step looks for."""
        return self.argument.split(maxsplit=1)[1] if self.action == "wait" else self.argument

    @property
    def keys(self) -> list[str]:
        return self.argument.split()

    def pilot_keys(self) -> list[str]:
        """The keys (or the text typed) as Textual's Pilot presses them."""
        if self.action == "type":
            return [PILOT_KEYS.get(c, c) for c in self.argument]
        return [PILOT_KEYS.get(key, key) for key in self.keys]


def tour_steps(path: Path = TOUR) -> list[Step]:
    """Every step of the tour, in order; an unknown action is an error, not skipped."""
    steps = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for action, argument in STEP.findall(line):
            if action not in ACTIONS:
                raise ValueError(f"{path}:{number}: unknown tour step {action!r}")
            steps.append(Step(action, argument, number))
    return steps
