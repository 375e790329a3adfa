"""The ``kvtop`` command: the terminal app by default, subcommands for headless work.

Exit codes shared by every command: 2 usage error, 70 internal error (a bug: a short message
on stderr says where the traceback was written), 130 Ctrl-C, 141 the reader of stdout went
away (``kvtop snapshot | head -1``), as for any Unix tool killed by SIGPIPE. Each command adds
its own (``check``: 0 no leak, 1 leak, 3 no usable data).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kvtop import __version__
from kvtop.collect.target import Target
from kvtop.config import (
    Config,
    ConfigError,
    add_prometheus_arguments,
    add_target_arguments,
    leak_params,
    load_config,
    parse_duration,
    positive_seconds,
    resolve_prometheus,
    resolve_targets,
)
from kvtop.crash import write_crash_report
from kvtop.exits import EXIT_BROKEN_PIPE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE
from kvtop.runtime import tune_gc
from kvtop.safe_text import display_text, terminal_lines, warn
from kvtop.store.writer import DEFAULT_MAX_BYTES, parse_size, size_text

if TYPE_CHECKING:
    from kvtop.baseline.overlay import BaselineOverlay
    from kvtop.collect.prometheus import PrometheusSettings
    from kvtop.derive.leak import LeakParams
    from kvtop.ui.app import AppConfig

EXIT_UNREADABLE = 3

# One line per command: `kvtop --help`, each command's own help, completions, the man page.
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
SHELLS = ("bash", "zsh", "fish")
DESCRIPTION = ("htop for the KV cache of vLLM, SGLang and llama.cpp servers: KV blocks, queues,\n"
               "preemptions, prefix hits, throughput, latency, local GPUs and a leak indicator.")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_MAX_SIZE_HELP = (f"stop recording when the file would pass SIZE (500M, 2G; 0 for no limit; "
                  f"default {size_text(DEFAULT_MAX_BYTES)})")


class Parser(argparse.ArgumentParser):
    """argparse, except that a closed stdout while printing --help or --version is not
    swallowed: it ends kvtop like any other write (exit 141)."""

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(terminal_lines(message))  # it quotes argv


def _output_arguments(parser: argparse.ArgumentParser, text_flags: tuple[str, ...],
                      text_help: str) -> None:
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", dest="as_json", action="store_true", default=None,
                        help="JSON (the default when stdout is not a terminal)")
    output.add_argument(*text_flags, dest="as_json", action="store_false", help=text_help)


def _snapshot_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "snapshot", help=SUMMARIES["snapshot"],
        description="Read every target (two scrapes --interval apart, so rates are filled "
                    "in) and print the snapshot JSON (docs/snapshot-json.md) or a table with "
                    "the app's columns. Exit 0 when every target was read, 3 when any could "
                    "not be.")
    add_target_arguments(parser)
    parser.add_argument("--interval", type=positive_seconds, default=1.0, metavar="S",
                        help="seconds between the samples (default 1)")
    parser.add_argument("--samples", type=int, choices=(1, 2), default=2,
                        help="1 for a single scrape (no rates), 2 (default) for rates")
    _output_arguments(parser, ("--table", "--text"),
                      "a table with the app's columns, one line per engine, never wrapped "
                      "(the default on a terminal)")
    parser.add_argument("--no-gpu", action="store_true", help="leave local GPUs out")
    add_prometheus_arguments(parser)
    parser.set_defaults(command=_run_snapshot)


def _run_snapshot(args: argparse.Namespace) -> int:
    from kvtop.commands.snapshot import run_snapshot

    config = load_config(args.config)
    if (prometheus := resolve_prometheus(args, config)) is not None:
        from kvtop.commands.prometheus import run_snapshot_prometheus

        return run_snapshot_prometheus(prometheus, timeout_s=args.timeout,
                                       insecure=args.insecure, as_json=args.as_json,
                                       with_gpus=not args.no_gpu)
    targets = resolve_targets(args, config)
    return run_snapshot(targets, samples=args.samples, interval_s=args.interval,
                        timeout_s=args.timeout, insecure=args.insecure,
                        as_json=args.as_json, with_gpus=not args.no_gpu,
                        full_metrics=args.full_metrics)


def _record_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "record", help=SUMMARIES["record"],
        description="Poll the targets and write every scrape (body or error) to a new "
                    "recording (docs/recording-format.md) until --duration passes or Ctrl-C. "
                    "Exit 0 when every scrape is in the file, 2 when FILE can't be created (it "
                    "exists: see --force), 4 when the recording falls short (write errors "
                    "such as a full disk, --max-size).")
    add_target_arguments(parser)
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                        help="the recording to write (JSON Lines; gzip when FILE ends in .gz)")
    parser.add_argument("--interval", type=positive_seconds, default=1.0, metavar="S",
                        help="seconds between scrapes of a target (default 1)")
    parser.add_argument("--duration", type=parse_duration, metavar="D",
                        help="stop after D (90s, 30m, 2h); default: until Ctrl-C")
    parser.add_argument("--max-size", type=_size, default=DEFAULT_MAX_BYTES, metavar="SIZE",
                        help=_MAX_SIZE_HELP + "; exit 4 when reached")
    parser.add_argument("--force", action="store_true",
                        help="replace FILE if it exists (never written through a symlink)")
    parser.set_defaults(command=_run_record)


def _run_record(args: argparse.Namespace) -> int:
    from kvtop.commands.record import run_record

    targets = resolve_targets(args, load_config(args.config))
    return run_record(targets, args.output, interval_s=args.interval,
                      duration_s=args.duration, timeout_s=args.timeout, insecure=args.insecure,
                      full_metrics=args.full_metrics, max_bytes=args.max_size,
                      replace=args.force)


def _check_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check", help=SUMMARIES["check"],
        description="Watch the targets for --duration (or read a recording with --replay, or "
                    "judge what Prometheus stored over the last --duration) through the leak "
                    "detector and print the worst verdict per engine (docs/check-json.md). "
                    "While watching, progress goes to stderr when it is a terminal. Exit 0 no "
                    "leak, 1 a leak found, 2 usage error or unreadable input, 3 no usable "
                    "data.")
    add_target_arguments(parser)
    parser.add_argument("--replay", type=Path, metavar="FILE",
                        help="judge a recording instead of live targets")
    parser.add_argument("--duration", type=parse_duration, default=None, metavar="D",
                        help="how long to watch live targets, or with --prometheus how far "
                             "back to judge (90s, 30m, 2h; default 30m)")
    parser.add_argument("--interval", type=positive_seconds, default=None, metavar="S",
                        help="seconds between scrapes (default 1; 5 with --prometheus)")
    parser.add_argument("--until-leak", action="store_true",
                        help="stop as soon as an engine is judged LEAK")
    parser.add_argument("--record", type=Path, metavar="FILE",
                        help="also write the live scrapes to a new recording")
    parser.add_argument("--record-max-size", type=_size, default=DEFAULT_MAX_BYTES,
                        metavar="SIZE", help=_MAX_SIZE_HELP)
    _output_arguments(parser, ("--text",), "the human-readable verdict even when stdout is "
                                            "not a terminal (cron mail, tee)")
    add_prometheus_arguments(parser)
    parser.set_defaults(command=_run_check)


def _run_check(args: argparse.Namespace) -> int:
    from kvtop.commands.check import run_check_live, run_check_replay

    config = load_config(args.config)
    params = leak_params(config)
    if args.replay is not None:
        if args.targets or args.duration or args.record:
            raise ConfigError("--replay reads a recording: give no targets, --duration "
                              "or --record with it")
        return run_check_replay(args.replay, params=params, as_json=args.as_json)
    if (prometheus := resolve_prometheus(args, config)) is not None:
        return _run_check_prometheus(args, prometheus, params)
    targets = resolve_targets(args, config)
    return run_check_live(targets, params=params, duration_s=args.duration or 1800.0,
                          interval_s=args.interval or 1.0, timeout_s=args.timeout,
                          insecure=args.insecure, until_leak=args.until_leak,
                          record=args.record, as_json=args.as_json,
                          full_metrics=args.full_metrics,
                          record_max_bytes=args.record_max_size)


def _run_check_prometheus(args: argparse.Namespace, prometheus: PrometheusSettings,
                          params: LeakParams) -> int:
    from kvtop.collect.prometheus import PROMETHEUS_INTERVAL_S
    from kvtop.commands.prometheus import run_check_prometheus

    if args.record:
        raise ConfigError("--record writes direct scrapes; Prometheus keeps its own history")
    return run_check_prometheus(prometheus, params=params,
                                duration_s=args.duration or 1800.0,
                                interval_s=args.interval or PROMETHEUS_INTERVAL_S,
                                timeout_s=args.timeout, insecure=args.insecure,
                                until_leak=args.until_leak, as_json=args.as_json)


def _rules_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rules", help=SUMMARIES["rules"],
        description="Print Prometheus rules (YAML, for rule_files:) implementing kvtop's "
                    "leak evidence in PromQL with the thresholds from the config's "
                    "[thresholds]; docs/prometheus.md says where PromQL differs.")
    parser.add_argument("--config", type=Path, metavar="FILE", help="TOML config")
    parser.add_argument("--selector", metavar="'{LABEL=\"VALUE\",...}'",
                        help="only series matching these labels (default: the config's "
                             "[prometheus] selector)")
    parser.set_defaults(command=_run_rules)


def _run_rules(args: argparse.Namespace) -> int:
    from kvtop.collect.prometheus import selector_matchers
    from kvtop.report.rules import render_rules

    config = load_config(args.config)
    selector = args.selector or str(config.prometheus.get("selector", ""))
    try:
        selector_matchers(selector)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    sys.stdout.write(render_rules(leak_params(config), selector))
    return 0


def _replay_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay", help=SUMMARIES["replay"],
        description="Replay a recording in the terminal app; everything (history, rates, "
                    "the leak indicator) is computed as it was live. Keys: space pause, "
                    "arrows step, [ ] seek, + - speed, ? for all.")
    parser.add_argument("recording", type=Path, metavar="FILE",
                        help="a recording written by kvtop record, kvtop check --record or "
                             "the app's --record (JSON Lines, .gz or not)")
    parser.add_argument("--speed", type=positive_seconds, default=1.0, metavar="X",
                        help="recording seconds per second (default 1)")
    parser.add_argument("--snapshot-dir", type=Path, default=Path.cwd(), metavar="DIR",
                        help="where the s key writes snapshots of the replayed moment "
                             "(default: current directory)")
    parser.add_argument("--baseline", metavar="NAME",
                        help="draw this saved baseline against the recording (as kvtop "
                             "--baseline)")
    parser.set_defaults(command=_run_replay)


def _run_replay(args: argparse.Namespace) -> int:
    from kvtop.ui.replay import run_replay

    baseline = _baseline_overlay(args.baseline, Config()) if args.baseline else None
    return run_replay(args.recording, speed=args.speed, snapshot_dir=args.snapshot_dir,
                      baseline=baseline)


def _sim_parser(subparsers: argparse._SubParsersAction) -> None:
    from kvtop.commands.sim import add_sim_parser, run_sim

    add_sim_parser(subparsers, SUMMARIES["sim"]).set_defaults(command=run_sim)


def _rehearse_parser(subparsers: argparse._SubParsersAction) -> None:
    from kvtop.commands.rehearse import add_rehearse_parser

    add_rehearse_parser(subparsers)


def _baseline_parser(subparsers: argparse._SubParsersAction) -> None:
    from kvtop.commands.baseline import add_baseline_parser

    add_baseline_parser(subparsers, SUMMARIES["baseline"])


def _compare_parser(subparsers: argparse._SubParsersAction) -> None:
    from kvtop.commands.baseline import add_compare_parser

    add_compare_parser(subparsers, SUMMARIES["compare"])


def _completion_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "completion", help=SUMMARIES["completion"],
        description="Print a completion script for SHELL, generated from kvtop's own "
                    "options. Install it with, for example: "
                    "bash: kvtop completion bash > ~/.local/share/bash-completion/completions/"
                    "kvtop; zsh: kvtop completion zsh > ~/.zfunc/_kvtop (a folder on $fpath); "
                    "fish: kvtop completion fish > ~/.config/fish/completions/kvtop.fish.")
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help=", ".join(SHELLS))
    parser.set_defaults(command=_run_completion)


def _run_completion(args: argparse.Namespace) -> int:
    from kvtop.completion import completion_script

    sys.stdout.write(completion_script(build_reference_parser(), args.shell))
    return 0


SUBCOMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "snapshot": _snapshot_parser,
    "record": _record_parser,
    "check": _check_parser,
    "replay": _replay_parser,
    "rules": _rules_parser,
    "sim": _sim_parser,
    "rehearse": _rehearse_parser,
    "baseline": _baseline_parser,
    "compare": _compare_parser,
    "completion": _completion_parser,
}


def _add_commands(parser: argparse.ArgumentParser) -> None:
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS.values():
        add(subparsers)


def build_command_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvtop")
    _add_commands(parser)
    return parser


def _commands_epilog() -> str:
    width = max(map(len, SUMMARIES))
    lines = [f"  {name:<{width}}  {summary}" for name, summary in SUMMARIES.items()]
    return ("commands (kvtop COMMAND --help for each):\n" + "\n".join(lines)
            + "\n\nKeys in the app: ? for help.")


def build_app_parser(*, with_commands: bool = False) -> argparse.ArgumentParser:
    """The app's options; ``with_commands`` adds the subcommands instead of the targets, one
    tree for completions and the man page (argparse can't parse both, so it never does)."""
    parser = Parser(
        prog="kvtop",
        usage=f"kvtop [TARGET ...] [options]\n       kvtop {{{','.join(SUBCOMMANDS)}}} ...",
        description=DESCRIPTION, epilog=_commands_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kvtop {__version__}")
    add_target_arguments(parser, positional=not with_commands)
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
    parser.add_argument("--record-max-size", type=_size, default=DEFAULT_MAX_BYTES,
                        metavar="SIZE", help=_MAX_SIZE_HELP)
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


def _baseline_overlay(name: str | None, config: Config) -> BaselineOverlay | None:
    """The baselines the app draws: --baseline for every target, the config's per target."""
    if name is None and not config.baselines:
        return None
    from kvtop.baseline.model import BaselineError
    from kvtop.baseline.overlay import BaselineOverlay

    try:
        return BaselineOverlay.load(config.baselines, name)
    except BaselineError as exc:
        raise ConfigError(f"baseline: {exc}") from None


def _app_config(args: argparse.Namespace, targets: list[Target], interval: float,
                config: Config, **extra: Any) -> AppConfig:
    from kvtop.ui.app import AppConfig

    return AppConfig(targets=targets, interval_s=interval, no_gpu=args.no_gpu,
                     snapshot_dir=args.snapshot_dir, low_bandwidth=args.low_bandwidth,
                     insecure=args.insecure, record=args.record,
                     record_max_bytes=args.record_max_size,
                     full_metrics=args.full_metrics, alerts=config.alerts, **extra)


def _run_app(args: argparse.Namespace) -> int:
    from kvtop.ui.app import run_app

    config = load_config(args.config)
    interval = args.interval or config.interval_s or 1.0
    baseline = _baseline_overlay(args.baseline, config)
    if (prometheus := resolve_prometheus(args, config)) is not None:
        return _run_app_prometheus(prometheus, args, args.interval or config.interval_s,
                                   config, baseline)
    if not args.demo:
        return run_app(_app_config(args, resolve_targets(args, config), interval, config,
                                   baseline=baseline))
    from kvtop.sim.demo import demo_fleet

    with demo_fleet() as targets:
        return run_app(_app_config(args, targets, interval, config, baseline=baseline))


def _run_app_prometheus(prometheus: PrometheusSettings, args: argparse.Namespace,
                        interval: float | None, config: Config,
                        baseline: BaselineOverlay | None) -> int:
    """The app on the instances Prometheus knows now, fed (and backfilled) through it."""
    import asyncio

    from kvtop.collect.prometheus import PROMETHEUS_INTERVAL_S, PrometheusError, PrometheusSource

    interval = interval or PROMETHEUS_INTERVAL_S
    from kvtop.commands.prometheus import discover_targets
    from kvtop.ui.app import run_app

    source = PrometheusSource(prometheus, interval_s=interval, timeout_s=args.timeout,
                              insecure=args.insecure)
    try:
        targets = asyncio.run(discover_targets(source))
    except PrometheusError as exc:
        warn(f"kvtop: {exc}")
        return EXIT_UNREADABLE
    return run_app(_app_config(args, targets, interval, config, baseline=baseline,
                               source_factory=lambda _config: source))


def _parse(argv: list[str]) -> tuple[argparse.Namespace, Callable[[argparse.Namespace], int]]:
    if argv and argv[0] in SUBCOMMANDS:
        args = build_command_parser().parse_args(argv)
        return args, args.command
    return build_app_parser().parse_args(argv), _run_app


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
    except Exception:
        return _internal_error()


def _drop_stdout() -> None:
    """The reader went away: send what is still buffered nowhere, so the interpreter's own
    flush at exit doesn't complain (the recipe in Python's signal documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _internal_error() -> int:
    """A bug: one line on stderr, the traceback in a file (no locals, so no secrets)."""
    line = write_crash_report(sys.exc_info()[1] or RuntimeError("unknown error"))
    print(display_text(f"kvtop: internal error, a bug: {line}"), file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
