"""The README's two set-up commands are what newcomers copy: keep them true."""

from __future__ import annotations

import re
import subprocess

from tests.support.paths import REPO


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


def test_ci_runs_the_readme_test_command_in_a_clone_with_nothing_beside_it() -> None:
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    test_command = setup_commands()[1]
    assert test_command in lines
    at = lines.index(test_command)
    clone = next(i for i, line in enumerate(lines) if line.startswith("git clone"))
    enter = max(i for i, line in enumerate(lines[:at]) if line.startswith("cd "))
    assert clone < enter < at  # the command runs inside the fresh clone...
    assert '"$CLONE_PARENT/kvtop"' in lines[clone] and lines[enter] == 'cd "$CLONE_PARENT/kvtop"'
    assert 'CLONE_PARENT="$(mktemp -d)"' in lines  # ...alone in a new temporary folder


def test_nothing_in_the_repository_reads_the_shared_folder() -> None:
    # The checkout is cloned alone: no code, test, script or CI step may reach outside it.
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    code = [REPO / name for name in tracked
            if name.endswith((".py", ".sh", ".toml")) or name == ".ci/run"]
    offenders = [str(path.relative_to(REPO)) for path in code
                 if re.search(r"\.\./shared|parents\[\d\]\.parent|/ \"shared\"",
                              path.read_text(encoding="utf-8"))]
    assert offenders == []
