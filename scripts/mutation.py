"""Mutation testing for kvtop's logic: does each module's test selection catch planted bugs?

Run from the repository root with the `mutation` extra installed (not part of CI: too slow):

    .venv/bin/pip install -e '.[test,mutation]'
    nice -n 10 .venv/bin/python scripts/mutation.py                    # every module below
    nice -n 10 .venv/bin/python scripts/mutation.py kvtop/derive/rates.py
    .venv/bin/python scripts/mutation.py --report kvtop/derive/rates.py  # last results, no run
    .venv/bin/python scripts/mutation.py --list                          # modules and their tests

The tool is mutmut 3 (pinned in pyproject.toml). It forks a mutant from a process that has
already imported pytest and runs only the tests that called the mutated function, which is what
makes this usable on a small shared machine; a tool that starts pytest once per mutant (cosmic-ray)
costs ~5 CPU-seconds of start-up per mutant here. Two operators mutmut lacks are added below: a
guard forced true or false (a removed check, a disabled branch) and `return x` -> `return None`.

Each module runs in its own workspace, .mutation/<module>/, with a mutmut config naming that module
and only the test files in MODULES (mutmut narrows further to the tests that reach each function).
Its results stay there, so `--report` is free and a rerun retests every mutant of the module.

Score = caught / (mutants - equivalent), caught = killed + timed out. Equivalent mutants (no
test can tell them apart from the code) are listed with their reason in
scripts/mutation_equivalents.toml, matched by module, function and the changed lines, so they
survive renumbering.

mutmut only mutates code inside functions and methods, so `--constants` adds a pass of its own
over what it cannot see: module constants and class attributes (dataclass defaults) that are
numbers or booleans, each set to 0 and to ten times itself (a boolean flipped), one pytest run of
the module's test files per mutant. Not mutated either way: @property bodies and other decorated
functions; code reached only from a subprocess (`python -m kvtop ...`) counts as not covered.
docs/testing.md says what this leaves out.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".mutation"
EQUIVALENTS = REPO / "scripts" / "mutation_equivalents.toml"
# Every test run on a mutant: no twin tier, no bytecode left in the copies, and the suite in
# its mutation mode (tests/support/mutation_run.py: few Hypothesis examples, caches empty per test)
MUTATION_ENV = {"KVTOP_TWIN": "0", "PYTHONDONTWRITEBYTECODE": "1", "KVTOP_MUTATION": "1"}


def deselected(path: str, *names: str) -> tuple[str, ...]:
    """pytest arguments that leave these tests of ``path`` out of a selection."""
    return tuple(arg for name in names for arg in ("--deselect", f"{path}::{name}"))


# Module -> the tests that exercise it: its own test file, tests/unit/<package>/test_<module>.py,
# plus the others that reach it in this process (a caller's tests, a hostile case); never the
# slow tiers (twin, tmux, real Prometheus, Textual Pilot) nor the tests marked `slow` (minutes
# of simulated scrapes each), which add minutes per mutant and no unit-level checks.
UNIT = "tests/unit"
ADAPTER_TESTS = tuple(f"{UNIT}/collect/adapters/test_{name}.py" for name in (
    "adapters", "vllm", "sglang", "llamacpp", "trtllm", "plausible"))
# The fuzz test (tests/hostile/test_recording_fuzz.py, 80 s) is left out: per mutant it costs
# more than the rest together, and test_recordings.py covers the same reader paths; so are
# the hostile tests that drive the Textual app (Pilot) or `kvtop record` in a subprocess
# (seconds each, and the writer they test runs in the subprocess, out of a mutant's reach:
# tests/unit/store/test_recording.py writes through the same limits in this process).
STORE_TESTS = (f"{UNIT}/store/test_recording.py", f"{UNIT}/store/test_replay.py",
               "tests/hostile/test_recordings.py",
               *deselected("tests/hostile/test_recordings.py",
                           "test_record_goes_on_through_a_full_disk_and_keeps_the_file_whole",
                           "test_record_through_refused_writes_keeps_one_valid_gzip",
                           "test_record_whose_end_cannot_be_written_still_reads_back",
                           "test_record_stops_at_max_size_with_a_whole_file",
                           "test_record_never_overwrites_a_file_or_follows_a_symlink",
                           "test_the_app_records_onto_a_full_disk_and_keeps_monitoring",
                           "test_the_app_stops_recording_at_its_limit_and_says_so",
                           "test_replay_of_a_crafted_file_shows_what_is_good_and_quits_on_q",
                           "test_replay_streams_and_rebuilds_on_a_seek_back",
                           "test_a_replay_draw_landing_at_shutdown_paints_nothing"))
# kvtop's command line run through main() in this process (no subprocess, no server)
CLI_IN_PROCESS = tuple(f"{UNIT}/test_cli.py::{name}" for name in (
    "test_unknown_config_keys_are_named_with_the_closest_known_one",
    "test_wrong_types_and_impossible_values_in_the_config_are_usage_errors",
    "test_nan_inf_zero_and_negative_numbers_on_the_command_line_are_usage_errors",
    "test_the_man_page_is_current_and_renders"))
# `kvtop snapshot` run in this process (its subprocess and simulator tests are out of reach)
SNAPSHOT_IN_PROCESS = tuple(f"{UNIT}/commands/test_snapshot.py::{name}" for name in (
    "test_snapshot_reads_twice_for_rates_and_exits_0_when_all_are_up",
    "test_one_unreadable_target_makes_the_exit_code_3",
    "test_one_read_gives_values_but_no_rates_and_no_wait",
    "test_kvtop_snapshot_prints_what_it_read_and_its_exit_code",
    "test_kvtop_snapshot_reads_every_metric_only_when_asked",
    "test_kvtop_snapshot_for_a_person_is_the_table_and_its_time_is_utc",
    "test_kvtop_snapshot_asks_for_its_series_only_unless_told",
    "test_kvtop_snapshot_keeps_to_the_timeout_given_or_twice_the_interval",
    "test_kvtop_snapshot_reads_a_self_signed_server_only_when_insecure",
    "test_kvtop_snapshot_in_this_process_is_json_to_a_pipe_and_its_notes_only_with_a_table",
    "test_kvtop_snapshot_shows_this_machines_gpus_unless_told_not_to",
    "test_a_snapshot_closes_its_connections_when_it_has_read",
    "test_the_two_reads_are_the_interval_given_apart",
    "test_a_watch_whose_prometheus_answers_nonsense_closes_its_connection",
    "test_a_prometheus_that_cannot_be_read_ends_a_snapshot_or_a_watch_with_exit_3",
    "test_watch_is_every_interval_given_or_the_reads_interval",
    "test_watch_prints_a_flushed_line_per_interval_until_ctrl_c",
    "test_watch_waits_for_every_target_to_be_tried_before_its_first_document",
    "test_a_watch_prints_nothing_before_its_first_beat_and_closes_its_connections",
    "test_watch_through_prometheus_shows_an_instance_its_discovery_missed",
    "test_watch_is_json_lines_only",
    "test_snapshot_is_listed_with_its_summary"))
POLLER_TESTS = (f"{UNIT}/collect/test_poller.py", "tests/hostile/test_bodies.py",
                *deselected("tests/hostile/test_bodies.py",
                            "test_the_app_shows_a_bad_value_as_bad_payload_and_reads_the_rest",
                            "test_a_big_body_is_read_off_the_event_loop"))
# The Prometheus package's tests: its modules' own, each source query through a fake API on
# 127.0.0.1 (the real-Prometheus tier, tests/prometheus, costs seconds a test and stays out)
PROMETHEUS_TESTS = (*(f"{UNIT}/collect/prometheus/test_{name}.py"
                      for name in ("source", "api", "promql", "answers")),
                    "tests/hostile/test_prometheus_answers.py")
KV_FLOOD_LEFT_OUT = deselected("tests/hostile/test_kv_events.py",
                               "test_a_flood_of_new_hashes_keeps_the_index_at_its_cap")
MODULES: dict[str, tuple[str, ...]] = {
    "kvtop/collect/exposition.py": (f"{UNIT}/collect/test_exposition.py",),
    **{f"kvtop/collect/adapters/{name}.py": ADAPTER_TESTS
       for name in ("__init__", "common", "vllm", "sglang", "llamacpp", "trtllm", "plausible")},
    # the poller and its HTTP client are reached through real servers on 127.0.0.1; left out:
    # the app's test (Pilot) and the one that times the event loop's lag (load-dependent)
    "kvtop/collect/poller.py": POLLER_TESTS,
    "kvtop/collect/http.py": POLLER_TESTS,
    **{f"kvtop/collect/prometheus/{name}.py": PROMETHEUS_TESTS
       for name in ("__init__", "answers", "api", "promql", "source")},
    # targets, tokens and secrets in URLs: test_cli.py's own cases run kvtop as a subprocess
    "kvtop/collect/target.py": (f"{UNIT}/collect/test_target.py", f"{UNIT}/collect/test_poller.py",
                                "tests/hostile/test_secrets.py", f"{UNIT}/store/test_recording.py",
                                f"{UNIT}/test_config.py", *CLI_IN_PROCESS,
                                f"{UNIT}/test_cli.py::test_only_http_and_https_urls_are_targets"),
    **{f"kvtop/collect/adapters/{name}.py": (f"{UNIT}/collect/adapters/test_gpu_exporters.py",)
       for name in ("dcgm", "nvidia_gpu_exporter")},
    # The parser's and Prometheus's caches are the bounded cache's users: their memory tests
    # fill it past its caps
    "kvtop/collect/bounded.py": (f"{UNIT}/collect/test_bounded.py",
                                 f"{UNIT}/collect/test_exposition.py",
                                 "tests/hostile/test_memory.py::"
                                 "test_the_parser_caches_hold_a_bounded_number_of_characters",
                                 "tests/hostile/test_memory.py::"
                                 "test_the_prometheus_head_cache_holds_a_bounded_number_of_characters"),
    # dataclasses only (the constants pass: their defaults), read by every adapter and the tracker
    "kvtop/collect/reading.py": (*ADAPTER_TESTS, f"{UNIT}/derive/test_tracker.py",
                                 f"{UNIT}/collect/test_reading.py"),
    # the GPU record and its JSON: NVML (faked), the exporters' adapters, the owners' views
    "kvtop/collect/gpu.py": (f"{UNIT}/report/test_gpus.py", f"{UNIT}/collect/test_nvml.py",
                             f"{UNIT}/collect/adapters/test_gpu_exporters.py",
                             f"{UNIT}/derive/test_gpu_owners.py"),
    # NVML through tests/fakes/fake_nvml.py (no GPU here); the ownership tests read it too
    "kvtop/collect/nvml.py": (f"{UNIT}/collect/test_nvml.py", f"{UNIT}/collect/test_ownership.py"),
    # the real /proc of this machine (a listening socket in the test process, child processes)
    # and the headless GPU entry that asks it
    "kvtop/collect/ownership.py": (f"{UNIT}/collect/test_ownership.py",
                                   f"{UNIT}/derive/test_gpu_owners.py",
                                   f"{UNIT}/report/test_gpus.py"),
    "kvtop/collect/clock.py": (f"{UNIT}/collect/test_clock.py",),
    # the sources' protocol, the one place a body or samples become a reading, the command
    # sources (direct, Prometheus) and the watch loop every long-running command runs
    "kvtop/collect/source.py": (f"{UNIT}/collect/test_source.py", f"{UNIT}/collect/test_live.py",
                                f"{UNIT}/derive/test_tracker.py",
                                f"{UNIT}/commands/test_check.py"),
    "kvtop/collect/live.py": (f"{UNIT}/collect/test_live.py", f"{UNIT}/commands/test_check.py",
                              f"{UNIT}/collect/test_source.py", *SNAPSHOT_IN_PROCESS),
    "kvtop/collect/watch.py": (f"{UNIT}/collect/test_watch.py", f"{UNIT}/commands/test_check.py",
                               f"{UNIT}/commands/test_record.py"),
    "kvtop/derive/rates.py": (f"{UNIT}/derive/test_rates.py",),
    "kvtop/derive/quantiles.py": (f"{UNIT}/derive/test_quantiles.py",),
    "kvtop/derive/stats.py": (f"{UNIT}/derive/test_stats.py", f"{UNIT}/derive/test_rates.py",
                              f"{UNIT}/derive/test_tracker.py"),
    # The leak tests' simulations of hours of scrapes (marked slow) cost seconds to a minute
    # each, per mutant: the detector is scored on the tests of its rules and parts, each well
    # under a second; the simulations stay in the normal suite.
    "kvtop/derive/leak_estimate.py": (f"{UNIT}/derive/test_leak.py",
                                      f"{UNIT}/derive/test_leak_load.py"),
    "kvtop/derive/leak.py": (f"{UNIT}/derive/test_leak.py", f"{UNIT}/derive/test_leak_load.py"),
    "kvtop/derive/leak_params.py": (f"{UNIT}/derive/test_leak.py", f"{UNIT}/test_config.py"),
    "kvtop/derive/leak_buckets.py": (f"{UNIT}/derive/test_leak.py",),
    "kvtop/derive/leak_floor.py": (f"{UNIT}/derive/test_leak.py",),
    "kvtop/derive/leak_load.py": (f"{UNIT}/derive/test_leak_load.py",
                                  f"{UNIT}/derive/test_leak.py"),
    # the tracker is the one entry every reading goes through: the unit tier drives it from
    # all sides (snapshots, rules, leak, commands), the GPU and memory tests reach its caps
    "kvtop/derive/tracker.py": (UNIT, "tests/hostile/test_memory.py",
                                "tests/hostile/test_boundary_sweep.py"),
    # the stall verdict: its tests (the two simulations of healthy and pressured load are slow),
    # the tracker's and the worst-verdict's
    "kvtop/derive/stall.py": (f"{UNIT}/derive/test_stall.py", f"{UNIT}/derive/test_tracker.py",
                              f"{UNIT}/derive/test_worst.py",
                              f"{UNIT}/commands/test_check.py::"
                              "test_the_text_says_stalled_in_the_headline_and_under_the_engine"),
    "kvtop/derive/worst.py": (f"{UNIT}/derive/test_worst.py", f"{UNIT}/commands/test_check.py"),
    # percentiles of plain samples: its unit test and the rehearsal's criteria and figures
    "kvtop/derive/samples.py": (f"{UNIT}/derive/test_samples.py",
                                f"{UNIT}/rehearse/test_latency.py",
                                f"{UNIT}/rehearse/test_advice.py"),
    "kvtop/derive/gpu_owners.py": (f"{UNIT}/derive/test_gpu_owners.py",
                                   f"{UNIT}/collect/test_ownership.py",
                                   f"{UNIT}/view/test_gpus.py"),
    # the config's two Hypothesis fuzz tests (500 documents, "no crash" only) are left out:
    # they reach every loader mutant at seconds each and catch nothing the rest does not; the
    # command-line tests that run in this process reach the option parsers and the man page
    "kvtop/config.py": (f"{UNIT}/test_config.py", *CLI_IN_PROCESS,
                        *deselected(f"{UNIT}/test_config.py",
                                    "test_the_loader_accepts_or_raises_config_error_only",
                                    "test_arbitrary_text_is_a_config_error_or_a_config")),
    # the command line's shared options and types, and the source they name
    "kvtop/cli_args.py": (f"{UNIT}/test_cli_args.py", *CLI_IN_PROCESS),
    # every exit code and its meaning: the --help epilogs and the man page are made from it
    "kvtop/exits.py": (f"{UNIT}/test_exits.py", f"{UNIT}/test_cli.py",
                       f"{UNIT}/derive/test_worst.py"),
    "kvtop/derive/verdicts.py": (f"{UNIT}/derive/test_verdicts.py", f"{UNIT}/derive/test_worst.py",
                                 f"{UNIT}/view/test_fleet.py"),
    "kvtop/contract.py": (f"{UNIT}/test_contract.py", f"{UNIT}/derive/test_worst.py"),
    "kvtop/commands/check.py": (f"{UNIT}/commands/test_check.py",
                                f"{UNIT}/collect/test_live.py"),
    "kvtop/report/output.py": (f"{UNIT}/report/test_output.py", f"{UNIT}/commands/test_check.py"),
    "kvtop/report/snapshot.py": (f"{UNIT}/report/test_snapshot.py", *SNAPSHOT_IN_PROCESS),
    # + its help in the man page, and an instance Prometheus's discovery missed
    "kvtop/commands/snapshot.py": (*SNAPSHOT_IN_PROCESS, *CLI_IN_PROCESS,
                                   f"{UNIT}/collect/test_live.py::"
                                   "test_an_instance_discovery_missed_is_shown_from_its_scrapes"),
    "kvtop/report/rules.py": (f"{UNIT}/report/test_rules.py",),
    "kvtop/view/table.py": (f"{UNIT}/view/test_table.py", *SNAPSHOT_IN_PROCESS,
                            "tests/hostile/test_headless_display.py::"
                            "test_the_table_never_reads_labels_as_markup"),
    "kvtop/report/gpus.py": (f"{UNIT}/report/test_gpus.py", f"{UNIT}/derive/test_gpu_owners.py",
                             *SNAPSHOT_IN_PROCESS),
    "kvtop/baseline/text.py": (f"{UNIT}/baseline/test_text.py",
                               f"{UNIT}/commands/test_baseline.py",
                               f"{UNIT}/baseline/test_compare.py::"
                               "test_text_output_names_the_change_first"),
    # `kvtop record` through main() in this process (its subprocess tests in
    # tests/hostile/test_recordings.py are out of a mutant's reach)
    "kvtop/commands/record.py": (f"{UNIT}/commands/test_record.py",),
    # every command-line test builds the rehearse parser, so a surviving mutant there costs
    # them all; the man page test pins every help text, the command's tests the options,
    # their defaults and errors, and runs refused or judged in this process (its `kvtop sim`
    # subprocess tests are left out)
    "kvtop/commands/rehearse.py": (f"{UNIT}/commands/test_rehearse.py", *CLI_IN_PROCESS,
                                   *deselected(f"{UNIT}/commands/test_rehearse.py",
                                               "test_refuses_what_is_not_an_openai_server",
                                               "test_refuses_a_server_whose_metrics_cannot_be_read",
                                               "test_a_model_it_does_not_serve_is_a_usage_error",
                                               "test_watch_only_judges_the_servers_own_histograms",
                                               "test_no_token_in_any_file_or_output",
                                               "test_outside_text_is_made_safe_in_the_text_report",
                                               "test_progress_lines")),
    "kvtop/commands/baseline.py": (f"{UNIT}/commands/test_baseline.py",
                                   f"{UNIT}/baseline/test_compare.py::test_commands_on_recordings",
                                   *CLI_IN_PROCESS),
    "kvtop/commands/compare.py": (f"{UNIT}/commands/test_compare.py",
                                  f"{UNIT}/commands/test_baseline.py",
                                  f"{UNIT}/baseline/test_compare.py::test_commands_on_recordings",
                                  *CLI_IN_PROCESS),
    # the go-live rehearsal (issue 28): each module's tests and the end-to-end runs' fast
    # parts in this process; tests/unit/rehearse/test_run.py drives `kvtop sim` processes
    # (seconds each) and is left out
    "kvtop/rehearse/criteria.py": tuple(f"{UNIT}/rehearse/test_{name}.py" for name in (
        "criteria", "latency", "gpu_memory", "kv_free", "verdict", "advice")),
    "kvtop/rehearse/latency.py": (f"{UNIT}/rehearse/test_latency.py",),
    "kvtop/rehearse/gpu_memory.py": (f"{UNIT}/rehearse/test_gpu_memory.py",),
    # the advice reads the leak's figures from the criterion
    "kvtop/rehearse/kv_free.py": (f"{UNIT}/rehearse/test_kv_free.py",
                                  f"{UNIT}/rehearse/test_advice.py"),
    "kvtop/rehearse/verdict.py": (f"{UNIT}/rehearse/test_verdict.py",),
    "kvtop/rehearse/advice.py": (f"{UNIT}/rehearse/test_advice.py",),
    "kvtop/rehearse/progress.py": (f"{UNIT}/rehearse/test_progress.py",
                                   f"{UNIT}/commands/test_rehearse.py::test_progress_lines"),
    "kvtop/rehearse/report.py": (f"{UNIT}/rehearse/test_report.py",
                                 f"{UNIT}/commands/test_rehearse.py::"
                                 "test_outside_text_is_made_safe_in_the_text_report"),
    "kvtop/rehearse/requests.py": (f"{UNIT}/rehearse/test_requests.py",
                                   f"{UNIT}/rehearse/test_latency.py",
                                   f"{UNIT}/commands/test_rehearse.py::test_progress_lines"),
    # whole rehearsals in this process against servers on 127.0.0.1 whose answers the test
    # sets (a second each); left out: the runs against `kvtop sim` processes (its own file's
    # first tests, and the command's: seconds each, which every mutant of the run would cost)
    "kvtop/rehearse/run.py": (f"{UNIT}/rehearse/test_run.py", *deselected(
        f"{UNIT}/rehearse/test_run.py",
        "test_a_healthy_server_is_go_and_its_log_agrees_with_its_counters",
        "test_a_slow_leak_only_free_kv_sees_is_no_go_naming_the_leak",
        "test_a_leak_that_wedges_the_pool_is_no_go_naming_the_stall_and_stops_early",
        "test_a_stall_is_no_go_naming_it_and_the_run_stops_early",
        "test_a_server_that_answers_nothing_is_never_go",
        "test_an_overloaded_server_is_no_go_on_latency",
        "test_a_restart_mid_run_is_reported_and_the_run_goes_on",
        "test_ctrl_c_stops_early_and_still_writes_the_report",
        "test_gpu_memory_growing_alone_fails_its_criterion_but_is_go")),
    # its own tests feed scrapes and GPU readings to a Watcher in this process; the command's
    # tests run whole rehearsals (seconds per mutant)
    "kvtop/rehearse/watch.py": (f"{UNIT}/rehearse/test_watch.py",),
    # the baseline: each module's tests; compare's scenario tests build recordings once a
    # session (seconds), so they stay in the normal suite and out of a mutant's run
    "kvtop/baseline/judge.py": (f"{UNIT}/baseline/test_judge.py",
                                f"{UNIT}/baseline/test_matched_load.py"),
    "kvtop/baseline/matched_load.py": (f"{UNIT}/baseline/test_matched_load.py",),
    "kvtop/baseline/compare.py": tuple(f"{UNIT}/baseline/test_compare.py::{name}" for name in (
        "test_the_overall_verdict", "test_the_leak_row",
        "test_a_setting_unknown_on_one_side_is_not_a_change",
        "test_an_inferred_version_is_no_change_against_an_exact_one",
        "test_llama_cpp_carries_what_it_exports",
        # the comparison on made-up runs (milliseconds each)
        "test_a_config_change_names_its_setting",
        "test_config_changes_in_order_derived_ones_only_alone", "test_an_engine_row_in_json",
        "test_the_verdict_and_exit_code_of_a_comparison",
        "test_without_a_matched_engine_the_comparison_is_unknown",
        "test_probes_and_gpus_count_in_the_verdict", "test_a_comparison_in_json",
        "test_the_alpha_reaches_every_figure",
        "test_a_changed_load_judges_load_driven_figures_on_the_load_both_saw",
        "test_engines_pair_with_the_closest_first", "test_match_engine_finds_the_closest_or_none",
        "test_runs_of_other_models_are_refused",
        "test_the_kind_and_version_are_settings_of_the_engine",
        "test_an_inferred_version_without_a_version_stays_unknown",
        "test_a_probe_is_compared_once_a_target_and_says_what_failed",
        "test_gpus_pair_by_place_and_a_lost_reading_is_noted",
        "test_the_leak_row_carries_both_runs_states_and_the_reason_now",
        "test_closeness_counts_what_two_engines_share")),
    "kvtop/baseline/collect.py": (f"{UNIT}/baseline/test_collect.py",
                                  f"{UNIT}/baseline/test_compare.py::"
                                  "test_llama_cpp_carries_what_it_exports"),
    "kvtop/baseline/overlay.py": (f"{UNIT}/baseline/test_overlay.py",),
    "kvtop/baseline/model.py": (f"{UNIT}/baseline/test_model.py",),
    "kvtop/baseline/store.py": (f"{UNIT}/baseline/test_store.py",),
    # the rank test's own file and its caller's; compare's scenario tests reach it too,
    # but rebuild their simulated recordings for every mutant (minutes each)
    "kvtop/baseline/stats.py": (f"{UNIT}/baseline/test_stats.py",
                                f"{UNIT}/baseline/test_judge.py"),
    "kvtop/baseline/figures.py": (f"{UNIT}/baseline/test_figures.py",
                                  f"{UNIT}/baseline/test_judge.py",
                                  f"{UNIT}/baseline/test_overlay.py"),
    # its in-process runs in the simulator's accelerated time; the GPU-swap test (24 s: two
    # 6-minute runs) adds nothing to what the 2-second runs reach here
    "kvtop/baseline/live.py": (f"{UNIT}/baseline/test_live.py", *deselected(
        f"{UNIT}/baseline/test_live.py", "test_a_live_run_keeps_gpu_memory_and_names_a_gpu_swap")),
    "kvtop/baseline/probe.py": (f"{UNIT}/baseline/test_probe.py",
                                f"{UNIT}/baseline/test_live.py",
                                f"{UNIT}/commands/test_baseline.py"),
    "kvtop/store/time_range.py": (f"{UNIT}/store/test_time_range.py",
                                  f"{UNIT}/commands/test_check.py::"
                                  "test_a_check_of_part_of_a_recording_judges_only_that_part",
                                  f"{UNIT}/commands/test_check.py::"
                                  "test_a_time_range_needs_a_recording_and_a_time"),
    **{f"kvtop/store/{name}.py": STORE_TESTS
       for name in ("format", "reader", "writer", "replay", "recording")},
    "kvtop/sim/blocks.py": (f"{UNIT}/sim/test_blocks.py", f"{UNIT}/sim/test_engine.py"),
    # KV anatomy (docs/kv-anatomy.md): the decoder with its fuzzed and hostile payloads, the
    # subscriber against a real ZeroMQ publisher on 127.0.0.1 (tests/fakes/kv_publisher.py)
    # (the hostile flood of new hashes is left out: 20 s under tracemalloc a run, and it tests
    # derive/kv_anatomy's index cap on batches it builds itself, not the decoder nor a socket)
    "kvtop/collect/kv_events.py": (f"{UNIT}/collect/test_kv_events.py",
                                   "tests/hostile/test_kv_events.py", *KV_FLOOD_LEFT_OUT,
                                   f"{UNIT}/store/test_recording.py"),
    "kvtop/collect/kv_subscriber.py": (f"{UNIT}/collect/test_kv_subscriber.py",
                                       "tests/hostile/test_kv_events.py", *KV_FLOOD_LEFT_OUT),
    # the config's own cases of an endpoint (its fuzz tests cost seconds a mutant)
    "kvtop/collect/kv_endpoint.py": (f"{UNIT}/collect/test_kv_endpoint.py", *(
        f"{UNIT}/test_config.py::{name}" for name in (
            "test_a_target_names_where_its_kv_events_are",
            "test_a_kv_events_endpoint_that_cannot_be_used_is_a_config_error"))),
    "kvtop/collect/kv_feed.py": (f"{UNIT}/collect/test_kv_feed.py",),
    "kvtop/derive/cache.py": (f"{UNIT}/derive/test_cache.py", f"{UNIT}/derive/test_rates.py"),
    "kvtop/derive/limits.py": (f"{UNIT}/derive/test_limits.py", f"{UNIT}/derive/test_tracker.py"),
    "kvtop/derive/kv_index.py": (f"{UNIT}/derive/test_kv_index.py",
                                 f"{UNIT}/derive/test_kv_anatomy.py"),
    "kvtop/derive/kv_anatomy.py": (f"{UNIT}/derive/test_kv_anatomy.py",
                                   f"{UNIT}/derive/test_tracker.py",
                                   "tests/hostile/test_kv_events.py"),
    "kvtop/sim/kv_publisher.py": (f"{UNIT}/sim/test_kv_publisher.py", f"{UNIT}/sim/test_server.py",
                                  *deselected(f"{UNIT}/sim/test_server.py",
                                              "test_kvtop_sim_command_serves_until_interrupted")),
    # the simulation's faults (leaks, lumps, wedges, restarts, stalls) drive the engine too
    "kvtop/sim/engine.py": (f"{UNIT}/sim/test_engine.py", f"{UNIT}/sim/test_simulation.py"),
    # the fleet view's model (issue 26 split it by concern): each part's own tests, and the
    # rows' tests that read cells and sort values through the rows
    "kvtop/view/cells.py": (f"{UNIT}/view/test_cells.py", f"{UNIT}/view/test_fleet.py",
                            f"{UNIT}/view/test_table.py"),
    "kvtop/view/sort_keys.py": (f"{UNIT}/view/test_sort_keys.py", f"{UNIT}/view/test_fleet.py",
                                f"{UNIT}/view/test_view_state.py"),
    "kvtop/view/fleet.py": (f"{UNIT}/view/test_fleet.py", f"{UNIT}/view/test_cells.py",
                            f"{UNIT}/view/test_view_state.py"),
    "kvtop/view/fleet_summary.py": (f"{UNIT}/view/test_fleet_summary.py",),
    "kvtop/view/verdict_changes.py": (f"{UNIT}/view/test_verdict_changes.py",),
    "kvtop/view/view_state.py": (f"{UNIT}/view/test_view_state.py",),
    # the KV cache's lines for a person (issue 29), and the detail's
    "kvtop/view/cache.py": (f"{UNIT}/view/test_cache.py", f"{UNIT}/view/test_engine.py",
                            f"{UNIT}/view/test_fleet_summary.py"),
    "kvtop/view/cache_detail.py": (f"{UNIT}/view/test_cache_detail.py",),
    "kvtop/view/format.py": (f"{UNIT}/view/test_format.py", f"{UNIT}/view/test_cells.py",
                             f"{UNIT}/view/test_fleet.py"),
    "kvtop/view/chart.py": (f"{UNIT}/view/test_chart.py", f"{UNIT}/view/test_engine.py",
                            f"{UNIT}/view/test_gpus.py"),
    "kvtop/view/engine.py": (f"{UNIT}/view/test_engine.py", f"{UNIT}/ui/widgets",
                             f"{UNIT}/ui/screens/test_detail.py"),
    "kvtop/report/snapshot_files.py": (f"{UNIT}/report/test_snapshot_files.py",),
    # the app's parts that hold no widget (the others are reached by tests/ui/pilot only)
    "kvtop/ui/draw_clock.py": (f"{UNIT}/ui/test_draw_clock.py",),
    "kvtop/ui/fleet_trackers.py": (f"{UNIT}/ui/test_fleet_trackers.py",),
    "kvtop/ui/kv_events_tap.py": (f"{UNIT}/ui/test_kv_events_tap.py",),
    # Every other module of kvtop/ (none is left out: tests/unit/scripts/test_mutation.py
    # fails on a module without an entry). Packages' __init__ files hold no function, so
    # mutmut finds nothing to plant there; their entries say which tests import them.
    **{f"kvtop/{package}/__init__.py": (f"{UNIT}/test_architecture.py",)
       for package in ("commands", "report", "store", "ui", "ui/screens", "ui/widgets", "view")},
    "kvtop/__init__.py": (f"{UNIT}/test_cli.py",),
    "kvtop/load/__init__.py": tuple(f"{UNIT}/load/test_{name}.py" for name in (
        "driver", "openai_client", "workloads")),
    "kvtop/rehearse/__init__.py": (f"{UNIT}/commands/test_rehearse.py",),
    "kvtop/sim/__init__.py": (f"{UNIT}/sim/test_simulation.py",),
    # the entry points: `python -m kvtop` and main() run in this process
    "kvtop/__main__.py": (f"{UNIT}/test_cli.py",),
    "kvtop/cli.py": (f"{UNIT}/test_cli.py", f"{UNIT}/test_cli_args.py"),
    "kvtop/manpage.py": (f"{UNIT}/test_manpage.py", f"{UNIT}/test_cli.py"),
    "kvtop/crash.py": (f"{UNIT}/test_crash.py",),
    "kvtop/runtime.py": (f"{UNIT}/test_runtime.py",),
    # the one output boundary, its readers' guard and the file reader every file kind uses
    "kvtop/safe_text.py": (f"{UNIT}/test_safe_text.py", "tests/hostile/test_headless_display.py",
                           "tests/hostile/test_secrets.py"),
    "kvtop/files.py": (f"{UNIT}/test_files.py", f"{UNIT}/test_config.py"),
    "kvtop/alerts.py": (f"{UNIT}/test_alerts.py",),
    "kvtop/commands/completion.py": (f"{UNIT}/commands/test_completion.py", f"{UNIT}/test_cli.py"),
    # `kvtop replay` through main() in this process, its app run headless under Pilot; the
    # man page pins its help. tests/ui/pilot/test_record_replay.py opens the app without the
    # command, and test_cli.py's own cases run it as a subprocess: neither reaches it here
    "kvtop/commands/replay.py": (f"{UNIT}/commands/test_replay.py", *CLI_IN_PROCESS),
    "kvtop/commands/rules.py": (f"{UNIT}/commands/test_rules.py", f"{UNIT}/report/test_rules.py",
                                f"{UNIT}/test_cli.py"),
    # `kvtop sim` through main() in this process: its options, errors and servers (Ctrl-C
    # from a helper thread); test_server.py runs it as a subprocess, out of a mutant's reach;
    # the man page test pins every help text
    "kvtop/commands/sim.py": (f"{UNIT}/commands/test_sim.py", *CLI_IN_PROCESS),
    # the load generator against a real OpenAI-compatible server on 127.0.0.1
    # (prompts and workloads: their own tests, then the driver's, which uses them; the client's
    # own tests reach every rule the driver's do, which take seconds more per mutant)
    **{f"kvtop/load/{name}.py": (f"{UNIT}/load/test_{name}.py", f"{UNIT}/load/test_driver.py")
       for name in ("prompts", "workloads")},
    "kvtop/load/openai_client.py": (f"{UNIT}/load/test_openai_client.py",),
    "kvtop/load/driver.py": (f"{UNIT}/load/test_driver.py",),
    # the simulator's other parts: its own tests and the engine's
    **{f"kvtop/sim/{name}.py": (f"{UNIT}/sim/test_{name}.py", f"{UNIT}/sim/test_engine.py",
                                f"{UNIT}/sim/test_simulation.py")
       for name in ("exposition", "simulation")},
    # the workloads' own tests but the one of the wheel's package data: it reads the checkout's
    # pyproject.toml, which in a mutation workspace is the mutmut config
    "kvtop/sim/workloads.py": (f"{UNIT}/sim/test_workloads.py", f"{UNIT}/sim/test_engine.py",
                               f"{UNIT}/sim/test_simulation.py", *deselected(
                                   f"{UNIT}/sim/test_workloads.py",
                                   "test_the_samples_ship_inside_the_package")),
    # the demo's story in simulated time and its fleet on 127.0.0.1
    "kvtop/sim/demo.py": (f"{UNIT}/sim/test_demo.py",),
    # the simulated servers over real HTTP on 127.0.0.1, in this process (`kvtop sim` in a
    # subprocess is out of a mutant's reach and costs seconds)
    "kvtop/sim/openai_api.py": (f"{UNIT}/sim/test_openai_api.py",),
    "kvtop/sim/server.py": (f"{UNIT}/sim/test_server.py", f"{UNIT}/sim/test_openai_api.py",
                            *deselected(f"{UNIT}/sim/test_server.py",
                                        "test_kvtop_sim_command_serves_until_interrupted")),
    # the faults' own tests, then run in a simulation and served over HTTP in this process
    # (`kvtop sim` in a subprocess is out of a mutant's reach and costs seconds)
    "kvtop/sim/faults.py": (f"{UNIT}/sim/test_faults.py", f"{UNIT}/sim/test_simulation.py",
                            f"{UNIT}/sim/test_engine.py", f"{UNIT}/sim/test_server.py",
                            *deselected(f"{UNIT}/sim/test_server.py",
                                        "test_kvtop_sim_command_serves_until_interrupted")),
    "kvtop/sim/stats.py": (f"{UNIT}/sim/test_stats.py", f"{UNIT}/sim/test_exposition.py",
                           f"{UNIT}/sim/test_engine.py"),
    "kvtop/view/gpus.py": (f"{UNIT}/view/test_gpus.py",),
    "kvtop/view/groups.py": (f"{UNIT}/view/test_groups.py", f"{UNIT}/view/test_fleet.py"),
    # Widgets scored on their own test file, which mounts them in a small app (Pilot, a
    # fraction of a second each), and the one app test that draws them end to end: the whole
    # Pilot tier below costs minutes per mutant
    "kvtop/ui/widgets/cache_pane.py": (f"{UNIT}/ui/widgets/test_cache_pane.py",
                                       "tests/ui/pilot/test_kv_cache.py::"
                                       "test_the_cache_pane_the_limit_and_the_exact_evidence"),
    "kvtop/ui/widgets/gpu_pane.py": (f"{UNIT}/ui/widgets/test_gpu_pane.py",
                                     "tests/ui/pilot/test_app.py::test_gpu_pane_with_fake_nvml"),
    # the table in a small app with kvtop.tcss, fed rows real trackers made of real scrapes:
    # cells, roles, widths, keys, mouse, repaints; the app's test of a header click sorting
    "kvtop/ui/widgets/fleet_table.py": (f"{UNIT}/ui/widgets/test_fleet_table.py",
                                        "tests/ui/pilot/test_habits.py::"
                                        "test_clicking_a_header_sorts_by_it_and_again_reverses"),
    # the small-terminal panel: its own app and figures, and the app showing a GPU beside KV
    "kvtop/ui/widgets/engine_panel.py": (f"{UNIT}/ui/widgets/test_engine_panel.py",
                                         "tests/ui/pilot/test_gpu_views.py::"
                                         "test_local_gpu_is_named_after_its_server"),
    "kvtop/ui/widgets/message_line.py": (f"{UNIT}/ui/widgets/test_message_line.py",
                                         "tests/ui/pilot/test_app.py::"
                                         "test_a_message_takes_the_footer_s_line_never_a_pane_s"),
    # the header in a small app with kvtop.tcss: every line, role, width and boundary; the
    # app's test of it live (hosts up from real scrapes) and paused
    "kvtop/ui/widgets/summary.py": (f"{UNIT}/ui/widgets/test_summary.py",
                                    "tests/ui/pilot/test_app.py::"
                                    "test_rows_show_what_the_servers_serve",
                                    "tests/ui/pilot/test_app.py::"
                                    "test_pause_freezes_display_while_collection_goes_on"),
    # the engine's panes in a small app with kvtop.tcss: title, verdict lines, charts cell by
    # cell; the app's test of the KV pane with the cache pane beside it, on real scrapes
    "kvtop/ui/widgets/panes.py": (f"{UNIT}/ui/widgets/test_panes.py",
                                  "tests/ui/pilot/test_kv_cache.py::"
                                  "test_the_cache_pane_the_limit_and_the_exact_evidence"),
    # the app's parts scored the same way: a small app of their own, and the app's tests of them
    # the views it hands the charts and the panel, from real trackers fed real scrapes
    "kvtop/ui/selected_engine.py": (f"{UNIT}/ui/test_selected_engine.py",),
    "kvtop/ui/snapshot_taker.py": (f"{UNIT}/ui/test_snapshot_taker.py",
                                   "tests/ui/pilot/test_app.py::"
                                   "test_snapshot_writes_json_bodies_and_svg",
                                   "tests/ui/pilot/test_app.py::"
                                   "test_snapshot_to_unwritable_folder_is_a_message"),
    "kvtop/ui/watchdog.py": (f"{UNIT}/ui/test_watchdog.py",
                             "tests/ui/pilot/test_app.py::test_lost_terminal_exits"),
    # two tables of bindings (no function for mutmut): its test reads every key and action
    "kvtop/ui/keys.py": (f"{UNIT}/ui/test_keys.py",
                         f"{UNIT}/test_cli.py::test_the_man_pages_keys_are_the_keys_the_app_binds"),
    # the F6 menu in a small app of its own, and the app's test that sorts through it
    "kvtop/ui/screens/sort_menu.py": (f"{UNIT}/ui/screens/test_sort_menu.py",
                                      "tests/ui/pilot/test_habits.py::"
                                      "test_f6_picks_a_sort_and_f3_searches"),
    # the detail in a small app with kvtop.tcss over real trackers fed real scrapes: every
    # line, the charts, Escape and scrolling; the app's test that opens and closes it
    "kvtop/ui/screens/detail.py": (f"{UNIT}/ui/screens/test_detail.py",
                                   "tests/ui/pilot/test_app.py::test_selection_and_detail"),
    # the help in a small app of its own (its text word for word), and the app's F1 test
    "kvtop/ui/screens/help.py": (f"{UNIT}/ui/screens/test_help.py",
                                 "tests/ui/pilot/test_habits.py::"
                                 "test_the_help_fits_80x24_and_explains_every_state"),
    # the recording in a small app with a real writer, and the app's recording test
    "kvtop/ui/recording_tap.py": (f"{UNIT}/ui/test_recording_tap.py",
                                  "tests/ui/pilot/test_record_replay.py::"
                                  "test_the_app_records_every_scrape_without_tokens"),
    # the replay app on real recordings: its bar, every key, its boundaries, what it makes of
    # a file. No Pilot test: theirs wait a minute for a frame that a planted crash never draws
    # (each such mutant cost its timeout), and this file asserts each of their steps exactly
    "kvtop/ui/replay.py": (f"{UNIT}/ui/test_replay.py",),
    # the alerts in a small app with real commands, and the app's test of them end to end
    "kvtop/ui/alert_tap.py": (f"{UNIT}/ui/test_alert_tap.py",
                              "tests/ui/pilot/test_alerts.py::"
                              "test_entering_leak_rings_and_runs_the_command_once"),
    # NVML in a small app with a fake reader and a real listening socket, and the app's test of
    # the GPU pane end to end
    "kvtop/ui/gpu_watch.py": (f"{UNIT}/ui/test_gpu_watch.py",
                              "tests/ui/pilot/test_app.py::test_gpu_pane_with_fake_nvml"),
    # one frame in a small app over real trackers fed real scrapes
    "kvtop/ui/frame.py": (f"{UNIT}/ui/test_frame.py",),
    # the app itself run headless (Pilot) on real scrapes: what each key, event and state
    # decides; its parts are scored on their own files (the whole Pilot tier: minutes a mutant)
    "kvtop/ui/app.py": (f"{UNIT}/ui/test_app.py",),
}


@dataclass
class ModuleResult:
    module: str
    statuses: dict[str, str] = field(default_factory=dict)  # mutant name -> mutmut status
    equivalent: dict[str, str] = field(default_factory=dict)  # mutant name -> reason
    diffs: dict[str, str] = field(default_factory=dict)  # surviving mutant -> its diff
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.statuses)

    @property
    def unchecked(self) -> int:
        return sum(status == "not checked" for status in self.statuses.values())

    @property
    def caught(self) -> int:
        return sum(status in ("killed", "timeout") for status in self.statuses.values())

    @property
    def missed(self) -> list[str]:
        return sorted(name for name, status in self.statuses.items()
                      if status not in ("killed", "timeout") and name not in self.equivalent)

    @property
    def score(self) -> float | None:
        counted = self.total - len(self.equivalent)
        return None if counted <= 0 else 100.0 * self.caught / counted


def dotted(module: str) -> str:
    name = module.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def workspace(module: str) -> Path:
    return WORK / module.removesuffix(".py").replace("/", "__")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _config(module: str, tests: Iterable[str]) -> str:
    """The workspace's pyproject.toml: the repo's pytest settings plus a mutmut section."""
    pytest_options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    mutmut = {
        "source_paths": ["kvtop"],
        "only_mutate": [module],
        "pytest_add_cli_args_test_selection": list(tests),
        # -n 0: mutmut's in-process trampoline sees only tests run in its own process
        "pytest_add_cli_args": ["-n", "0", "-p", "no:cacheprovider", "-p", "no:randomly",
                                "-m", "not slow"],
        # rerun on demand only; a pyproject change must not silently reset results
        "use_git_change_detection": False,
        # the man page test compares it with the parsers' help; the leak tests read the
        # documented defaults from docs/leak-detector.md; tests/baseline builds its recordings
        # with benchmarks/baseline_eval
        "also_copy": ["man", "docs", "benchmarks"],
        # mutmut's default gives a mutant 30x the time its tests took in the traced first
        # run (itself several times a plain run): an endless loop then holds a core for
        # half an hour; 8x that is still far above any plain run on a loaded machine
        "timeout_multiplier": 4.0,
    }
    lines = ["[tool.pytest.ini_options]"]
    lines += [f"{key} = {_toml_value(value)}"
              for key, value in pytest_options["ini_options"].items()]
    lines += ["", "[tool.mutmut]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in mutmut.items()]
    return "\n".join(lines) + "\n"


def prepare(module: str, fresh: bool) -> Path:
    """A workspace whose kvtop/, tests/, man/ and docs/ are the repo's own (mutmut copies them
    into mutants/)."""
    ws = workspace(module)
    if fresh and ws.exists():
        shutil.rmtree(ws)
    ws.mkdir(parents=True, exist_ok=True)
    for name in ("kvtop", "tests", "man", "docs", "benchmarks"):
        link = ws / name
        # a workspace copied from another checkout must test this one's code and tests
        if link.is_symlink() and link.readlink() != REPO / name:
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(REPO / name)
    # the test tree is copied afresh so removed or renamed tests cannot linger
    shutil.rmtree(ws / "mutants" / "tests", ignore_errors=True)
    (ws / "pyproject.toml").write_text(_config(module, MODULES[module]))
    return ws


def has_functions(module: str) -> bool:
    tree = ast.parse((REPO / module).read_text())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in ast.walk(tree))


def _survivors(module: str) -> list[str]:
    """Mutants of the last run that were not caught (or not run), minus the equivalent ones."""
    result = collect(module, load_equivalents(), set())
    if result is None:
        return []
    return [name for name in result.missed if "__mutmut_" in name]


def _meta(module: str) -> Path:
    return workspace(module) / "mutants" / (module + ".meta")


def _exit_codes(module: str) -> dict[str, int | None]:
    meta = _meta(module)
    return json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}


def _keep_earlier_results(module: str, earlier: dict[str, int | None], rerun: set[str]) -> None:
    """mutmut forgets every result when it re-creates the mutants (new tests do that): put
    back those of the mutants not rerun. Sound only while the module is unchanged, which is
    what --survivors is for (tests added since the last run)."""
    meta = _meta(module)
    if not meta.exists():
        return
    data = json.loads(meta.read_text())
    codes = data["exit_code_by_key"]
    for name, code in earlier.items():
        if name in codes and name not in rerun and codes[name] is None:
            codes[name] = code
    meta.write_text(json.dumps(data))


def _forget_verdicts(module: str) -> None:
    """Every mutant unchecked again (mutmut reruns those only)."""
    meta = _meta(module)
    if meta.exists():
        data = json.loads(meta.read_text())
        data["exit_code_by_key"] = dict.fromkeys(data["exit_code_by_key"])
        meta.write_text(json.dumps(data))


def run_mutmut(module: str, jobs: int, fresh: bool, survivors_only: bool = False) -> int:
    names = _survivors(module) if survivors_only and not fresh else [f"{dotted(module)}.x*"]
    earlier = _exit_codes(module) if survivors_only and not fresh else {}
    config = workspace(module) / "pyproject.toml"
    config_before = config.read_text() if config.exists() else None
    ws = prepare(module, fresh)
    if not has_functions(module) or not names:
        return 0
    if not survivors_only:
        # mutmut reuses its map of which tests reach which function and extends it only for
        # new tests: after the module changed, a new function would have "no tests"
        (ws / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
        # a plain run names every mutant, so mutmut reruns them all; forgetting the verdicts
        # of a changed list first keeps a run stopped halfway from showing stale ones
        if config_before not in (None, config.read_text()):
            _forget_verdicts(module)
    command = [sys.executable, str(Path(__file__).resolve()), "--mutmut", "run",
               "--max-children", str(jobs), *names]
    env = {**os.environ, **MUTATION_ENV}
    code = subprocess.run(command, cwd=ws, env=env, check=False).returncode
    if earlier:
        _keep_earlier_results(module, earlier, set(names))
    return code


# --- the constants pass: what mutmut does not mutate ------------------------------------------

@dataclass(frozen=True)
class ConstantMutant:
    owner: str  # "<module>" or the class the attribute belongs to
    line: int
    before: str  # the line, stripped
    after: str
    source: str  # the whole mutated module

    @property
    def name(self) -> str:
        return f"{self.owner}:{self.line}:{self.after}"


def _numeric(node: ast.expr) -> bool:
    """A number written as a literal or arithmetic on literals (15 * 60.0), not a bool."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    return False


def _replacements(node: ast.expr, text: str) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return [str(not node.value)]
    if not _numeric(node):
        return []
    if eval(compile(ast.Expression(node), "<constant>", "eval")) == 0:  # literals only
        return ["1"]
    return ["0", f"{text} * 10" if isinstance(node, ast.Constant) else f"({text}) * 10"]


def _assignments(tree: ast.Module) -> Iterator[tuple[str, ast.Assign | ast.AnnAssign]]:
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            yield "<module>", node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.Assign, ast.AnnAssign)):
                    yield node.name, item


def _code(line: str, end: int) -> str:
    """The line without its trailing comment (end: the byte offset where the value ends)."""
    raw = line.encode()
    rest = raw[end:].decode()
    return (raw[:end].decode() + ("" if rest.lstrip().startswith("#") else rest)).strip()


def constant_mutants(module: str) -> list[ConstantMutant]:
    source = (REPO / module).read_text()
    lines = source.splitlines(keepends=True)
    mutants = []
    for owner, node in _assignments(ast.parse(source)):
        value = node.value
        if value is None or value.lineno != value.end_lineno:
            continue
        line = lines[value.lineno - 1]
        # col offsets count UTF-8 bytes
        raw = line.encode()
        text = raw[value.col_offset:value.end_col_offset].decode()
        for replacement in _replacements(value, text):
            mutated = (raw[:value.col_offset] + replacement.encode()
                       + raw[value.end_col_offset:]).decode()
            mutants.append(ConstantMutant(
                owner, value.lineno, _code(line, value.end_col_offset),
                _code(mutated, value.end_col_offset + len(replacement) - len(text)),
                "".join(lines[:value.lineno - 1]) + mutated + "".join(lines[value.lineno:])))
    return mutants


def _digest(module: str) -> str:
    return hashlib.sha256((REPO / module).read_bytes()).hexdigest()[:16]


def _pytest(copy: Path, tests: Iterable[str], timeout: float) -> str:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:randomly",
               "-p", "no:cacheprovider", "-m", "not slow", *tests]
    env = {**os.environ, **MUTATION_ENV}
    try:
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return "timeout"
    return {0: "survived", 1: "killed", 5: "no tests"}.get(done.returncode, "suspicious")


def run_constants(module: str) -> int:
    """Each constant mutant in a copy of the repo's code, tests and docs, the module's tests
    run on it."""
    import time

    ws = prepare(module, fresh=False)
    copy = ws / "constants"
    shutil.rmtree(copy, ignore_errors=True)
    # what the tests import or read besides kvtop/ (tests/conftest.py imports benchmarks/)
    for name in ("kvtop", "tests", "docs", "benchmarks", "man"):
        shutil.copytree(REPO / name, copy / name)
    shutil.copy2(ws / "pyproject.toml", copy / "pyproject.toml")
    tests = MODULES[module]
    started = time.monotonic()
    if _pytest(copy, tests, timeout=1800) != "survived":
        print(f"{module}: the tests fail on the unmutated copy; constants pass skipped")
        return 1
    timeout = 5 * (time.monotonic() - started) + 30
    results = {}
    target = copy / module
    original = target.read_text()
    mutants = constant_mutants(module)
    for index, mutant in enumerate(mutants, 1):
        target.write_text(mutant.source)
        status = _pytest(copy, tests, timeout)
        target.write_text(original)
        print(f"  [{index}/{len(mutants)}] {status:9} {mutant.owner}: {mutant.after}", flush=True)
        results[mutant.name] = {"status": status, "owner": mutant.owner, "line": mutant.line,
                                "before": mutant.before, "after": mutant.after}
    (ws / "constants.json").write_text(json.dumps(
        {"digest": _digest(module), "mutants": results}, indent=1))
    shutil.rmtree(copy)
    return 0


def _changed_lines(diff: str) -> tuple[str, str]:
    before, after = [], []
    for line in diff.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("-"):
            before.append(line[1:].strip())
        elif line.startswith("+"):
            after.append(line[1:].strip())
    return "\n".join(before), "\n".join(after)


def _context_lines(diff: str) -> set[str]:
    """The unchanged lines around a mutation, stripped ("" included: no context asked)."""
    return {""} | {line.strip() for line in diff.splitlines() if line.startswith(" ")}


def _function_of(mutant: str) -> str:
    mangled = mutant.partition("__mutmut_")[0].rpartition(".")[2]
    return mangled.removeprefix("x_").split("ǁ")[-1]


def load_equivalents() -> list[dict[str, str]]:
    if not EQUIVALENTS.exists():
        return []
    return tomllib.loads(EQUIVALENTS.read_text())["equivalent"]


def _equivalent(entry: dict[str, str], module: str, function: str, before: str, after: str,
                context: set[str]) -> bool:
    return (entry["module"] == module and entry["function"] == function
            and entry["before"].strip() == before and entry["after"].strip() == after
            and entry.get("context", "").strip() in context)


def _mark(result: ModuleResult, name: str, function: str, diff: str,
          equivalents: list[dict[str, str]], used: set[int]) -> None:
    before, after = _changed_lines(diff)
    context = _context_lines(diff)
    for index, entry in enumerate(equivalents):
        if _equivalent(entry, result.module, function, before, after, context):
            result.equivalent[name] = entry["reason"]
            used.add(index)
            return
    result.diffs[name] = diff


def collect(module: str, equivalents: list[dict[str, str]], used: set[int]) -> ModuleResult | None:
    """Read a module's last results (mutmut's and the constants pass's) from its workspace."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    ws = workspace(module)
    result = ModuleResult(module)
    meta = _meta(module)
    if meta.exists():
        exit_codes = json.loads(meta.read_text())["exit_code_by_key"]
        result.statuses = {name: status_by_exit_code[code] for name, code in exit_codes.items()}
        cwd = Path.cwd()
        os.chdir(ws)
        try:
            for name, status in result.statuses.items():
                if status not in ("killed", "timeout"):
                    _mark(result, name, _function_of(name),
                          get_diff_for_mutant(name, path=module), equivalents, used)
        finally:
            os.chdir(cwd)
    constants = ws / "constants.json"
    if constants.exists():
        stored = json.loads(constants.read_text())
        if stored["digest"] != _digest(module):
            result.notes.append("constants pass is older than the module: rerun --constants")
        for name, mutant in stored["mutants"].items():
            result.statuses[name] = mutant["status"]
            if mutant["status"] not in ("killed", "timeout"):
                diff = f"line {mutant['line']}\n-{mutant['before']}\n+{mutant['after']}"
                _mark(result, name, mutant["owner"], diff, equivalents, used)
    if result.unchecked:
        result.notes.append(f"{result.unchecked} mutants not checked (the run was cut short)")
    return result if result.statuses else None


def report(results: list[ModuleResult], show: bool) -> None:
    print(f"\n{'module':42} {'mutants':>7} {'equiv':>5} {'caught':>6} {'missed':>6} {'score':>7}")
    for r in results:
        score = "-" if r.score is None else f"{r.score:6.1f}%"
        print(f"{r.module:42} {r.total:7} {len(r.equivalent):5} {r.caught:6} "
              f"{len(r.missed):6} {score:>7}")
        for note in r.notes:
            print(f"    {note}")
    if not show:
        return
    for r in results:
        for name in r.missed:
            print(f"\n# {name}: {r.statuses[name]}\n{r.diffs[name]}")


def stale_equivalents(equivalents: list[dict[str, str]], used: set[int],
                      modules: Iterable[str]) -> Iterator[dict[str, str]]:
    """Entries for the modules just reported that matched no mutant: the code moved on."""
    wanted = set(modules)
    for index, entry in enumerate(equivalents):
        if entry["module"] in wanted and index not in used:
            yield entry


def mutmut_main(argv: list[str]) -> None:
    """mutmut's own command line, with kvtop's two extra operators registered first."""
    import libcst as cst
    from mutmut.__main__ import cli
    from mutmut.mutation.mutators import mutation_operators

    def force_guard(node: cst.If) -> Iterator[cst.If]:
        yield node.with_changes(test=cst.Name("True"))
        yield node.with_changes(test=cst.Name("False"))

    def return_none(node: cst.Return) -> Iterator[cst.Return]:
        if node.value is not None and not (isinstance(node.value, cst.Name)
                                           and node.value.value == "None"):
            yield node.with_changes(value=cst.Name("None"))

    mutation_operators.extend([(cst.If, force_guard), (cst.Return, return_none)])
    cli(argv, prog_name="mutmut")


def main() -> int:
    if sys.argv[1:2] == ["--mutmut"]:
        mutmut_main(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="module paths (default: all in MODULES)")
    parser.add_argument("--report", action="store_true", help="print the last results, run nothing")
    parser.add_argument("--fresh", action="store_true", help="discard a module's workspace first")
    parser.add_argument("--survivors", action="store_true",
                        help="rerun only the mutants the last run did not catch (after adding "
                             "tests; a change to a module's test list reruns everything)")
    parser.add_argument("--constants", action="store_true",
                        help="also run the constants pass (a pytest run per mutant: slow)")
    parser.add_argument("--only-constants", action="store_true",
                        help="run the constants pass alone")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--quiet", action="store_true", help="no diffs of the missed mutants")
    parser.add_argument("--list", action="store_true", help="print modules and their tests")
    args = parser.parse_args()
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"not in MODULES: {', '.join(unknown)}")
    modules = args.modules or list(MODULES)
    if args.list:
        for module in modules:
            print(module, " ".join(MODULES[module]))
        return 0
    failed = []
    if not args.report:
        for module in modules:
            print(f"\n=== {module}", flush=True)
            if not args.only_constants and run_mutmut(module, args.jobs, args.fresh,
                                                      args.survivors) != 0:
                failed.append(module)
            if (args.constants or args.only_constants) and run_constants(module) != 0:
                failed.append(module)
    equivalents, used = load_equivalents(), set()
    results = [r for m in modules if (r := collect(m, equivalents, used)) is not None]
    report(results, show=not args.quiet)
    for entry in stale_equivalents(equivalents, used, [r.module for r in results]):
        print(f"\nstale equivalent (matches no surviving mutant): {entry['module']} "
              f"{entry['function']}: {entry['before']!r} -> {entry['after']!r}")
    if failed:
        print(f"\nmutmut failed for: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
