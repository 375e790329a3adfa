"""`kvtop completion` in this process (tests/unit/test_cli.py runs the scripts in the
shells): the script for each shell, made from kvtop's own parser, paths completing paths."""

from __future__ import annotations

import argparse

import pytest

from kvtop.cli import build_reference_parser, main
from kvtop.commands.completion import SHELLS, _mark_paths, completion_script
from kvtop.exits import EXIT_OK, EXIT_USAGE


@pytest.mark.parametrize("shell", SHELLS)
def test_each_shell_gets_the_script_of_kvtops_own_parser(
        shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == EXIT_OK
    script = capsys.readouterr().out
    assert script == completion_script(build_reference_parser(), shell)


@pytest.mark.parametrize(("shell", "files", "folders"), [
    ("bash", "_shtab_kvtop___config_COMPGEN=_shtab_compgen_files",
     "_shtab_kvtop___snapshot_dir_COMPGEN=_shtab_compgen_dirs"),
    ("zsh", ":FILE:_files\"", ":DIR:_files -/\""),
    ("fish", '-l config -xka "(__fish_complete_path (commandline -ct))"',
     "-l snapshot-dir -xka \"(__fish_complete_directories)\"")])
def test_the_scripts_complete_files_and_folders_where_kvtop_takes_them(
        shell: str, files: str, folders: str) -> None:
    script = completion_script(build_reference_parser(), shell)
    assert files in script and folders in script


def test_every_path_option_of_every_command_is_marked() -> None:
    parser = argparse.ArgumentParser()
    for metavar in ("FILE", "PATH", "RECORDING", "DIR", "NAME"):
        parser.add_argument(f"--{metavar.lower()}", metavar=metavar)
    sub = parser.add_subparsers().add_parser("sub")
    sub.add_argument("--inner", metavar="FILE")
    _mark_paths(parser, "files", "folders")
    marked = {a.dest: getattr(a, "complete", None) for a in parser._actions if a.dest != "help"}
    assert {k: v for k, v in marked.items() if k != "==SUPPRESS=="} == {
        "file": "files", "path": "files", "recording": "files", "dir": "folders", "name": None}
    inner = next(a for a in sub._actions if a.dest == "inner")
    assert getattr(inner, "complete", None) == "files"


def test_the_command_and_its_shells_are_listed_and_any_other_shell_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listed = [line.split(None, 1) for line in capsys.readouterr().out.splitlines()
              if line.strip().startswith("completion ")]
    assert listed == [["completion", "print a shell completion script for bash, zsh or fish"]]
    assert main(["completion", "--help"]) == 0
    assert any(line.split(None, 1) == ["SHELL", "bash, zsh, fish"]
               for line in capsys.readouterr().out.splitlines())
    assert main(["completion", "tcsh"]) == EXIT_USAGE
    assert "invalid choice: 'tcsh'" in capsys.readouterr().err
