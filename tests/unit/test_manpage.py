"""kvtop(1)'s writer on parsers of its own: what roff needs escaped, which options are
listed and how, a command's synopsis and sections, and `python -m kvtop.manpage`. That the
page in man/ is current and renders with groff is tests/unit/test_cli.py's."""

from __future__ import annotations

import argparse

import pytest

from kvtop.cli import SUMMARIES
from kvtop.manpage import _commands, _options, _synopsis, main, render, roff


def test_roff_escapes_backslashes_hyphens_and_non_ascii_and_reads_no_line_as_a_request() -> None:
    assert roff("C:\\kv --x Δ") == "C:\\ekv \\-\\-x \\[u0394]"
    assert roff("one\n.TH two\n'three\nfour.") == "one\n\\&.TH two\n\\&'three\nfour."
    assert roff("") == ""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvtop demo")
    parser.add_argument("--version", action="version", version="1")
    parser.add_argument("--hidden", help=argparse.SUPPRESS)
    parser.add_argument("--every", type=float, default=2.0, help="every %(default)s s, 100%% sure")
    parser.add_argument("--mode", choices=["fast", "slow"], help="")
    parser.add_argument("--kind", choices=["a", "b"], metavar="KIND", help="what to read")
    parser.add_argument("--quiet", "-q", action="store_true", help="say less")
    parser.add_argument("shape", choices=["round", "flat"])
    parser.add_argument("order", choices=["up", "down"], help="which way")
    parser.add_argument("hosts", nargs="+", metavar="HOST", help="servers")
    parser.add_argument("files", nargs="*", help="what-to-read")
    return parser


def test_options_are_listed_in_order_without_help_version_or_suppressed_ones() -> None:
    assert _options(_parser()) == [
        # argparse's %-expansion, as --help shows it
        ".TP", "\\fB\\-\\-every\\fR \\fIEVERY\\fR", "every 2.0 s, 100% sure",
        ".TP", "\\fB\\-\\-mode\\fR \\fIMODE\\fR", "(one of: fast, slow)",
        ".TP", "\\fB\\-\\-kind\\fR \\fIKIND\\fR", "what to read (one of: a, b)",
        ".TP", "\\fB\\-\\-quiet\\fR, \\fB\\-q\\fR", "say less",
        # a positional without help is its choices; without a metavar, its name
        ".TP", "\\fIshape\\fR", "round, flat",
        ".TP", "\\fIorder\\fR", "which way",
        ".TP", "\\fIHOST\\fR", "servers",
        ".TP", "\\fIfiles\\fR", "what\\-to\\-read",
    ]


def test_a_synopsis_names_the_positionals_and_those_that_repeat() -> None:
    assert _synopsis("demo", _parser()) == (
        "\\fBkvtop demo\\fR [\\fIoptions\\fR] \\fIshape\\fR \\fIorder\\fR [\\fIHOST\\fR ...] "
        "[\\fIfiles\\fR ...]")


def test_each_command_is_a_section_and_each_of_its_actions_an_indented_entry() -> None:
    reference = argparse.ArgumentParser(prog="kvtop")
    commands = reference.add_subparsers()
    snapshot = commands.add_parser("snapshot")  # no description: an empty paragraph
    snapshot.add_argument("targets", nargs="*", metavar="TARGET")
    baseline = commands.add_parser("baseline", description="Baselines:\n.kept")
    actions = baseline.add_subparsers()
    actions.add_parser("save").add_argument("name")
    actions.add_parser("rm", description="remove-one").add_argument(
        "--force", action="store_true", help="no question")
    assert _commands(reference) == [
        ".SH COMMANDS",
        ".SS " + roff(f"snapshot: {SUMMARIES['snapshot']}"),
        "\\fBkvtop snapshot\\fR [\\fIoptions\\fR] [\\fITARGET\\fR ...]", ".PP", "",
        ".TP", "\\fITARGET\\fR", "",
        ".SS " + roff(f"baseline: {SUMMARIES['baseline']}"),
        "\\fBkvtop baseline\\fR [\\fIoptions\\fR]", ".PP", "Baselines:\n\\&.kept",
        ".TP", "\\fBkvtop baseline save\\fR", "", ".RS", ".TP", "\\fIname\\fR", "", ".RE",
        ".TP", "\\fBkvtop baseline rm\\fR", "remove\\-one",
        ".RS", ".TP", "\\fB\\-\\-force\\fR", "no question", ".RE",
    ]


def test_python_m_kvtop_manpage_writes_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main() == 0
    assert capsys.readouterr().out == render()
