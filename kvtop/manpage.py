"""kvtop(1), written from the same argparse parser that parses the command line, and its
KEYS from the app's own key lists (the help screen's, kvtop/ui/screens/help.py; the
replay's, kvtop/ui/replay.py), so the page never lists a key the app does not bind.

    python -m kvtop.manpage > man/kvtop.1      # tests/unit/test_cli.py checks it is current

Deterministic (no date, no terminal width): the page changes only when an option does.
"""

from __future__ import annotations

import argparse
import sys

from kvtop import __version__
from kvtop.cli import SUMMARIES, build_app_parser, build_reference_parser
from kvtop.exits import APP, by_code
from kvtop.ui.replay import REPLAY_KEYS
from kvtop.ui.screens.help import KEYS, MORE_KEYS

ENVIRONMENT = (
    ("KVTOP_TOKEN", "bearer token for the command-line targets when --token-env is not given"),
    ("XDG_CONFIG_HOME", "where the default config lives: $XDG_CONFIG_HOME/kvtop/config.toml"),
    ("KVTOP_TRACES_DIR", "kvtop sim: a folder with the full Mooncake and Azure traces, "
                         "instead of the samples shipped with kvtop"),
    ("XDG_DATA_HOME", "where baselines are saved: $XDG_DATA_HOME/kvtop/baselines/NAME.json "
                      "(default ~/.local/share)"),
    ("NO_COLOR", "the app draws without colour"),
)


def roff(text: str) -> str:
    """Plain text as roff: backslashes, hyphens and non-ASCII characters escaped, no line
    read as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = "".join(c if c.isascii() else f"\\[u{ord(c):04X}]" for c in text)  # groff: Δ
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line
                     for line in text.splitlines())


def _flags(action: argparse.Action) -> str:
    names = ", ".join(f"\\fB{roff(name)}\\fR" for name in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or action.dest.upper()
    return f"{names} \\fI{roff(str(metavar))}\\fR"


def _positional(action: argparse.Action) -> str:
    """What stands for a positional argument: its metavar, else its name (as argparse's
    usage line)."""
    return roff(str(action.metavar or action.dest))


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        label = _flags(action) if action.option_strings else f"\\fI{_positional(action)}\\fR"
        text = action.help or ""
        if action.choices and not action.option_strings:
            text = text or ", ".join(map(str, action.choices))
        elif action.choices:
            text = f"{text} (one of: {', '.join(map(str, action.choices))})".lstrip()
        if "%" in text:  # argparse's own expansion: %(default)s, %%
            text = text % {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        lines += [".TP", label, roff(text)]
    return lines


def _synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    positionals = [a for a in parser._actions if not a.option_strings
                   and not isinstance(a, argparse._SubParsersAction)]
    words = [f"\\fBkvtop {name}\\fR", "[\\fIoptions\\fR]"]
    for action in positionals:
        metavar = f"\\fI{_positional(action)}\\fR"
        words.append(f"[{metavar} ...]" if action.nargs in ("*", "+") else metavar)
    return " ".join(words)


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _commands(reference: argparse.ArgumentParser) -> list[str]:
    subparsers = _subcommands(reference)
    assert subparsers is not None
    lines = [".SH COMMANDS"]
    for name, sub in subparsers.choices.items():
        lines += [".SS " + roff(f"{name}: {SUMMARIES[name]}"), _synopsis(name, sub), ".PP",
                  roff(sub.description or ""), *_options(sub)]
        actions = _subcommands(sub)  # kvtop baseline save|list|show|rm
        for action_name, action in (actions.choices.items() if actions else ()):
            lines += [".TP", f"\\fBkvtop {name} {action_name}\\fR",
                      roff(action.description or ""), ".RS", *_options(action), ".RE"]
    return lines


def exit_status() -> list[tuple[int, list[str]]]:
    """Each code (kvtop.exits) with what it means: for every command, or per command."""
    return [(code, [meaning if not command else
                    f"{'the app' if command == APP else command}: {meaning}"
                    for command, meaning in meanings])
            for code, meanings in by_code().items()]


def _exit_status() -> list[str]:
    lines = []
    for code, meanings in exit_status():
        lines += [".TP", f"\\fB{code}\\fR", "\n.br\n".join(map(roff, meanings))]
    return lines


def _keys() -> list[str]:
    """The app's keys, then those kvtop replay adds."""
    def entries(keys: tuple[tuple[str, str], ...]) -> list[str]:
        return [line for key, what in keys
                for line in (".TP", f"\\fB{roff(key)}\\fR", roff(what))]

    return [".SH KEYS", roff("In the app (F1 or ? shows them there):"),
            *entries(KEYS + MORE_KEYS), ".PP", roff("kvtop replay adds:"),
            *entries(REPLAY_KEYS)]


def render() -> str:
    """The whole page, as roff."""
    app = build_app_parser()
    lines = [
        f'.TH KVTOP 1 "" "kvtop {__version__}" "User Commands"',
        ".SH NAME",
        "kvtop \\- htop for the KV cache of LLM inference servers",
        ".SH SYNOPSIS",
        "\\fBkvtop\\fR [\\fITARGET\\fR ...] [\\fIoptions\\fR]",
        ".br",
        "\\fBkvtop\\fR \\fICOMMAND\\fR [\\fIoptions\\fR]",
        ".SH DESCRIPTION",
        roff(" ".join((app.description or "").split())),
        ".PP",
        roff("Without a command, kvtop opens the terminal app on the targets (press ? in it "
             "for every key). A target is host:port or an http(s) URL; /metrics is added "
             "when no path is given. Tokens are never taken from the command line."),
        ".SH OPTIONS",
        *_options(app),
        *_commands(build_reference_parser()),
        *_keys(),
        ".SH EXIT STATUS",
        *_exit_status(),
        ".SH ENVIRONMENT",
        *[line for name, text in ENVIRONMENT for line in (".TP", f"\\fB{name}\\fR", roff(text))],
        ".SH FILES",
        ".TP",
        "\\fI~/.config/kvtop/config.toml\\fR",
        roff("targets, names, groups, tokens (token_env / token_file), request headers "
             "(headers = {NAME = \"$VAR\"}) and a CA bundle (cacert) per target, the interval, "
             "[thresholds] of the leak detector and [prometheus]; an unknown key is a usage "
             "error that names the closest known one; baseline = \"NAME\" per target."),
        ".TP",
        "\\fI~/.local/share/kvtop/baselines/NAME.json\\fR",
        roff("baselines saved by kvtop baseline save, compared against by kvtop compare and "
             "drawn by the app's --baseline."),
        ".SH SEE ALSO",
        roff("The README and docs/ of the kvtop repository: snapshot-json.md, check-json.md, "
             "recording-format.md, leak-detector.md, prometheus.md, baseline-format.md, "
             "compare-json.md."),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
