"""The ``kvtop`` command: the terminal app by default, subcommands for headless work.

Each command is a module of :mod:`kvtop.commands` with ``add_parser(subparsers, summary)``
and ``run(args) -> int``; this module holds their list, the app's own options and main().
Exit codes, shared and per command, are in :mod:`kvtop.exits`: each command's ``--help``
lists its own.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

from kvtop import __version__
from kvtop.cli_args import (
    MAX_SIZE_HELP,
    add_kv_events_argument,
    add_prometheus_arguments,
    add_target_arguments,
    no_terminal,
    open_source,
    positive_seconds,
    size,
)
from kvtop.config import Config, ConfigError, load_config, quoted
from kvtop.crash import write_crash_report
from kvtop.exits import (
    APP,
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_UNREADABLE,
    EXIT_USAGE,
    epilog,
)
from kvtop.runtime import tune_gc
from kvtop.safe_text import display_text, terminal_lines, warn
from kvtop.store.writer import DEFAULT_MAX_BYTES

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from kvtop.collect.source import Source
    from kvtop.collect.target import Target
    from kvtop.derive.tracker import TargetTracker
    from kvtop.ui.app import AppConfig

# The commands, in the order --help lists them, with the one line that --help, each
# command's own help, the completions and the man page show.
SUMMARIES: dict[str, str] = {
    "snapshot": "read the targets once and print JSON or a table",
    "record": "write every scrape to a recording for replay and check",
    "check": "headless leak verdict for scripts, cron and CI (exit 1 on a leak)",
    "replay": "open the terminal app on a recording (pause, step, seek, speed)",
    "rules": "print Prometheus recording and alerting rules for KV-cache leaks",
    "sim": "serve simulated vLLM servers (KV cache, queues, faults) on 127.0.0.1",
    "rehearse": "go-live rehearsal: drive load for hours, watch, GO / NO-GO verdict",
    "baseline": "save a server's healthy state to compare later runs against",
    "compare": "compare live targets, a recording or another baseline with a baseline",
    "completion": "print a shell completion script for bash, zsh or fish",
}
DESCRIPTION = ("htop for the KV cache of vLLM, SGLang and llama.cpp servers: KV blocks, queues,\n"
               "preemptions, prefix hits, throughput, latency, local GPUs and a leak indicator.")


class Parser(argparse.ArgumentParser):
    """argparse, except that a closed stdout while printing --help or --version is not
    swallowed: it ends kvtop like any other write (exit 141); and an unknown option is
    answered with the closest known one."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(terminal_lines(message))  # it quotes argv

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            message += self._closest_option(message.split(": ", 1)[1].split())
        super().error(message)

    def _closest_option(self, words: list[str]) -> str:
        known = list(self._option_string_actions)
        for word in words:
            if word.startswith("-"):
                close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1)
                if close:
                    return f" (did you mean '{close[0]}'?)"
        return ""


class Formatter(argparse.HelpFormatter):
    """Descriptions wrapped to the terminal; text already laid out in lines (the app's
    description, the exit codes) kept as it is."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def command_module(name: str) -> ModuleType:
    """The module of command ``name`` (imported when a command line needs it)."""
    return importlib.import_module(f"kvtop.commands.{name}")


def _add_commands(parser: argparse.ArgumentParser) -> None:
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for name, summary in SUMMARIES.items():
        module = command_module(name)
        command = module.add_parser(subparsers, summary)
        command.set_defaults(command=module.run)
        _with_exit_codes(command, name)
    parser.set_defaults(reference=build_reference_parser)  # for `kvtop completion`


def _with_exit_codes(parser: argparse.ArgumentParser, command: str) -> None:
    """The command's exit codes (kvtop.exits) as its --help epilog, and its actions'."""
    parser.epilog = epilog(command)
    parser.formatter_class = Formatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):  # kvtop baseline save|list|…
            for sub in action.choices.values():
                _with_exit_codes(sub, command)


def build_command_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvtop")
    _add_commands(parser)
    return parser


def _commands_epilog() -> str:
    width = max(map(len, SUMMARIES))
    lines = [f"  {name:<{width}}  {summary}" for name, summary in SUMMARIES.items()]
    return ("commands (kvtop COMMAND --help for each):\n" + "\n".join(lines)
            + "\n\nKeys in the app: ? for help.\n\n" + epilog(APP))


def build_app_parser(*, with_commands: bool = False) -> argparse.ArgumentParser:
    """The app's options; ``with_commands`` adds the subcommands instead of the targets, one
    tree for completions and the man page (argparse can't parse both, so it never does)."""
    parser = Parser(
        prog="kvtop",
        usage=f"kvtop [TARGET ...] [options]\n       kvtop {{{','.join(SUMMARIES)}}} ...",
        description=DESCRIPTION, epilog=_commands_epilog(), formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"kvtop {__version__}")
    add_target_arguments(parser, positional=not with_commands)
    add_kv_events_argument(parser)
    parser.add_argument("--interval", type=positive_seconds, metavar="S",
                        help="seconds between scrapes (default 1, or the config's)")
    parser.add_argument("--demo", action="store_true",
                        help="watch a built-in simulated fleet (one server starts leaking)")
    parser.add_argument("--no-gpu", action="store_true", help="no GPU pane, no NVML")
    parser.add_argument("--snapshot-dir", type=Path, default=Path.cwd(), metavar="DIR",
                        help="where the s key writes snapshots (default: current directory)")
    parser.add_argument("--low-bandwidth", action="store_true",
                        help="no charts and slower redraws, for slow ssh links")
    parser.add_argument("--record", type=Path, metavar="FILE",
                        help="also write every scrape to a new recording (for kvtop "
                             "replay/check)")
    parser.add_argument("--record-max-size", type=size, default=DEFAULT_MAX_BYTES,
                        metavar="SIZE", help=MAX_SIZE_HELP)
    parser.add_argument("--baseline", metavar="NAME",
                        help="draw this saved baseline (kvtop baseline save) in the panes and "
                             "a Δ column of KV p50 and TTFT p99 against it; or per target: "
                             "baseline = \"NAME\" in the config")
    add_prometheus_arguments(parser)
    if with_commands:
        _add_commands(parser)
    return parser


def build_reference_parser() -> argparse.ArgumentParser:
    """Every option of the app and of each command, in one parser."""
    return build_app_parser(with_commands=True)


# -- the app --------------------------------------------------------------------------------


def _app_config(args: argparse.Namespace, targets: list[Target], interval: float,
                config: Config, **extra: Any) -> AppConfig:
    from kvtop.ui.app import AppConfig

    return AppConfig(targets=targets, interval_s=interval, no_gpu=args.no_gpu,
                     snapshot_dir=args.snapshot_dir, low_bandwidth=args.low_bandwidth,
                     insecure=args.insecure, record=args.record,
                     record_max_bytes=args.record_max_size,
                     full_metrics=args.full_metrics, alerts=config.alerts, **extra)


def _run_app(args: argparse.Namespace) -> int:
    """The app on the source the options name: the targets, the demo fleet, or the
    instances Prometheus knows now (found first, then fed and backfilled through it)."""
    import asyncio

    from kvtop.baseline.overlay import baseline_overlay
    from kvtop.collect.source import SourceError
    from kvtop.ui.app import run_app

    config = load_config(args.config)
    baseline = baseline_overlay(args.baseline, config.baselines)
    if no_terminal("kvtop", "`kvtop snapshot` (JSON) or `kvtop snapshot --table`"):
        return EXIT_USAGE
    with open_source(args, config, interval_s=args.interval or config.interval_s,
                     demo=args.demo) as source:
        try:
            targets = asyncio.run(_discover(source))
        except SourceError as exc:
            warn(f"kvtop: {exc}")
            return EXIT_UNREADABLE
        return run_app(_app_config(args, targets, source.interval_s, config,
                                   baseline=baseline,
                                   source_factory=lambda _config: source.live(),
                                   kv_events_factory=lambda _config: source.kv_live(),
                                   tracker_factory=_trackers(config)))


def _trackers(config: Config) -> Callable[[Target], TargetTracker]:
    """A tracker per target, with the config's max_num_seqs where it names one."""
    from kvtop.derive.tracker import TargetTracker

    return lambda target: TargetTracker(target, limit_params=config.limits.get(target.url))


async def _discover(source: Source) -> list[Target]:
    try:
        return await source.discover()
    finally:
        await source.aclose()  # the app runs the source again on its own event loop


# -- main -----------------------------------------------------------------------------------


def _parse(argv: list[str]) -> tuple[argparse.Namespace, Callable[[argparse.Namespace], int]]:
    if argv and argv[0] in SUMMARIES:
        parser = build_command_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command's own parser, with its usage line
            _innermost(parser, argv).error(f"unrecognized arguments: {' '.join(unknown)}")
        return args, args.command
    app = build_app_parser()
    _refuse_a_command_as_target(_first_positional(argv, app))
    return app.parse_args(argv), _run_app


def _innermost(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``argv`` names: ``kvtop baseline save`` -> save's."""
    for word in argv:
        subparsers = next((a for a in parser._actions
                           if isinstance(a, argparse._SubParsersAction)), None)
        if subparsers is None or word not in subparsers.choices:
            break
        parser = subparsers.choices[word]
    return parser


def _first_positional(argv: list[str], parser: argparse.ArgumentParser) -> str | None:
    """The first word of ``argv`` that is neither an option nor an option's value; None
    after ``--``, which says the words that follow are targets, whatever they look like."""
    takes_value = {flag for action in parser._actions if action.nargs != 0
                   for flag in action.option_strings}
    words = iter(argv)
    for word in words:
        if word == "--":
            return None
        if word.startswith("-") and word != "-":
            if word in takes_value:
                next(words, None)
            continue
        return word
    return None


def _host_like(word: str) -> bool:
    return any(mark in word for mark in ":/.") or word.lower() == "localhost"


def _refuse_a_command_as_target(word: str | None) -> None:
    """``kvtop chek host:8000`` is a typo, not a server named "chek": usage error (exit 2)
    with the command meant and its usage line, rather than the app with a row "chek down"."""
    if word is None or _host_like(word):
        return
    if word in SUMMARIES:
        message = f"the command '{word}' comes first: kvtop {word} [options]"
    elif close := difflib.get_close_matches(word, list(SUMMARIES), n=1):
        word, message = close[0], (f"unknown command {quoted(word)} (did you mean "
                                   f"'{close[0]}'?)\na server is written host:port or as a URL")
    else:
        return
    command = build_command_parser()
    for line in message.splitlines():  # warn() shows a newline as \x0a: a line each
        warn(f"kvtop: {line}")
    sys.stderr.write(terminal_lines(_innermost(command, [word]).format_usage()))
    raise SystemExit(EXIT_USAGE)


def _run(argv: list[str]) -> int:
    try:
        args, command = _parse(argv)
    except SystemExit as done:  # --help, --version, or a usage error argparse reported
        if isinstance(done.code, int):
            return done.code
        return 0 if done.code is None else EXIT_USAGE
    try:
        return command(args)
    except ConfigError as exc:
        warn(f"kvtop: {exc}")
        return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    tune_gc()
    try:
        code = _run(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # a closed pipe shows up here, not in the interpreter's exit
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as bug:
        return _internal_error(bug)


def _drop_stdout() -> None:
    """The reader went away: send what is still buffered nowhere, so the interpreter's own
    flush at exit doesn't complain (the recipe in Python's signal documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _internal_error(bug: Exception) -> int:
    """A bug: one line on stderr, the traceback in a file (no locals, so no secrets)."""
    line = write_crash_report(bug)
    print(display_text(f"kvtop: internal error, a bug: {line}"), file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
