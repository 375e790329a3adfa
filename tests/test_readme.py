"""The README's two set-up commands are what newcomers copy: keep them true."""

from __future__ import annotations

import re

from tests.paths import REPO


def setup_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    head = text[: text.index("\n## ")]  # the commands sit near the top, before any section
    return re.findall(r"```bash\n(.+?)\n```", head, flags=re.S)


def test_readme_has_exactly_two_setup_commands() -> None:
    commands = setup_commands()
    assert len(commands) == 2, commands
    install_and_run, install_and_test = commands
    assert "kvtop --demo" in install_and_run and "pip install" in install_and_run
    assert "pytest" in install_and_test


def test_ci_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    test_command = setup_commands()[1]
    assert test_command in ci.splitlines()
