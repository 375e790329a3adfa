"""The exit codes' help epilog: a code and its meaning per line, wrapped for a terminal."""

from __future__ import annotations

import pytest

from kvtop.exits import EXITS, epilog, exit_codes


@pytest.mark.parametrize("command", sorted(EXITS))
def test_the_epilog_fits_79_columns_and_continues_under_the_meaning(command: str) -> None:
    lines = epilog(command).splitlines()
    assert lines[0] == "exit status:"
    width = max(len(str(code)) for code, _ in exit_codes(command))
    for line in lines[1:]:
        assert len(line) <= 79
        indent = len(line) - len(line.lstrip(" "))
        assert indent in (2, width + 4)  # "  3  meaning" or the meaning's next line


def test_the_default_width_is_79_where_it_makes_a_difference() -> None:
    differs = [command for command in EXITS if epilog(command) != epilog(command, 80)]
    assert differs  # the width is seen in at least one command's text
    assert all(epilog(command) == epilog(command, 79) for command in EXITS)

