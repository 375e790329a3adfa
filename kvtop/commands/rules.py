"""``kvtop rules``: Prometheus recording and alerting rules for KV-cache leaks, from the
config's [thresholds] (docs/prometheus.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvtop.config import ConfigError, leak_params, load_config
from kvtop.exits import EXIT_OK


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "rules", help=summary,
        description="Print Prometheus rules (YAML, for rule_files:) implementing kvtop's "
                    "leak evidence in PromQL with the thresholds from the config's "
                    "[thresholds]; docs/prometheus.md says where PromQL differs.")
    parser.add_argument("--config", type=Path, metavar="FILE", help="TOML config")
    parser.add_argument("--selector", metavar="'{LABEL=\"VALUE\",...}'",
                        help="only series matching these labels (default: the config's "
                             "[prometheus] selector)")
    return parser


def run(args: argparse.Namespace) -> int:
    from kvtop.collect.prometheus import selector_matchers
    from kvtop.report.rules import render_rules

    config = load_config(args.config)
    selector = args.selector or config.prometheus.selector
    try:
        selector_matchers(selector)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    sys.stdout.write(render_rules(leak_params(config), selector))
    return EXIT_OK
