"""`kvtop sim`: serve one or more simulated vLLM servers until Ctrl-C (or SIGTERM)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
from typing import TYPE_CHECKING, Any

from kvtop.cli_args import fraction, non_negative_number, positive_number
from kvtop.config import ConfigError
from kvtop.exits import EXIT_CANNOT_LISTEN, EXIT_OK, EXIT_USAGE
from kvtop.safe_text import display_text
from kvtop.sim.engine import EngineConfig
from kvtop.sim.faults import plan
from kvtop.sim.workloads import WORKLOADS

if TYPE_CHECKING:
    from kvtop.sim.server import SimConfig, SimFleet

# The servers have this process to themselves: their stepping may take most of each tick
# (the rest answers HTTP), so a fast --speed keeps up under API load.
CPU_SHARE = 0.75


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sim", help=summary,
        description="Serve simulated vLLM V1 servers whose /metrics look like vLLM 0.33's, "
                    "each printing its URL on a line of stdout, until Ctrl-C.")
    p.add_argument("--port", type=int, default=8001,
                   help="first port; server i listens on port+i (0: ephemeral ports)")
    p.add_argument("--count", type=int, default=1, help="number of servers (default 1)")
    p.add_argument("--workload", choices=WORKLOADS, default="synthetic",
                   help="requests the server makes up itself (none: only those sent to its "
                        "OpenAI API, /v1/completions and /v1/chat/completions)")
    p.add_argument("--rate", type=positive_number, default=None,
                   help="synthetic: requests/s; traces: rate scale (<1 subsample, >1 faster)")
    p.add_argument("--blocks", type=int, default=2000, help="num_gpu_blocks (default 2000)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output (default: what the KV cache holds)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--kv-cache-metrics", action="store_true",
                   help="export block residency histograms, as vLLM's --kv-cache-metrics")
    p.add_argument("--kv-events-port", type=int, default=None, metavar="PORT",
                   help="publish KV events on tcp://127.0.0.1:PORT+i (0: ephemeral), as "
                        "vLLM's zmq publisher; replay on --kv-events-replay-port")
    p.add_argument("--kv-events-replay-port", type=int, default=0, metavar="PORT",
                   help="replay socket of server i on PORT+i (default: ephemeral)")
    p.add_argument("--leak-frac", type=fraction, default=0.0,
                   help="fraction of finished/aborted requests that never free their blocks")
    p.add_argument("--leak-at", type=non_negative_number, default=0.0,
                   help="simulated second the leak starts")
    p.add_argument("--restart-at", type=non_negative_number, action="append", default=[],
                   help="simulated second of a restart (repeatable)")
    p.add_argument("--stall-at", type=non_negative_number, default=None,
                   help="simulated second of a stall")
    p.add_argument("--stall-for", type=positive_number, default=None,
                   help="stall length (default: ever)")
    p.add_argument("--wedge-at", type=non_negative_number, default=None,
                   help="simulated second at which every free block is taken and the engine "
                        "stops (the end of a leak: pool full, queue growing, no progress)")
    p.add_argument("--slow-metrics", type=non_negative_number, default=0.0,
                   help="seconds each /metrics answer is delayed")
    p.add_argument("--hang-at", type=non_negative_number, default=None,
                   help="simulated second from which /metrics never answers")
    p.add_argument("--malformed-at", type=non_negative_number, default=None,
                   help="simulated second from which /metrics is malformed")
    p.add_argument("--require-token-env", metavar="VAR", default=None,
                   help="answer 401 unless 'Authorization: Bearer $VAR' is sent")
    p.add_argument("--names", choices=("v1", "v0", "sglang"), default="v1",
                   help="metric names: vLLM 0.33 (v1), vLLM 0.7 V0 (v0) or SGLang")
    p.add_argument("--model-name", default="sim-llama-3-8b")
    p.add_argument("--speed", type=positive_number, default=1.0,
                   help="simulated seconds per second")
    p.add_argument("--seed", type=int, default=0)
    return p


def configs_from_args(args: argparse.Namespace) -> list[SimConfig]:
    """One config per server; seeds differ so the servers do not move in lockstep."""
    from kvtop.sim.server import SimConfig  # aiohttp only when serving: `kvtop` starts fast

    token = None
    if args.require_token_env:
        token = os.environ.get(args.require_token_env)
        if not token:
            raise ConfigError(f"--require-token-env: ${args.require_token_env} is empty or "
                              "unset")
    faults = plan(leak_frac=args.leak_frac, leak_at=args.leak_at, restart_at=args.restart_at,
                  stall_at=args.stall_at, stall_for=args.stall_for, wedge_at=args.wedge_at,
                  slow_metrics=args.slow_metrics, hang_at=args.hang_at,
                  malformed_at=args.malformed_at, token=token)
    engine = EngineConfig(num_gpu_blocks=args.blocks, block_size=args.block_size,
                          max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens,
                          max_model_len=args.max_model_len,
                          enable_prefix_caching=not args.no_prefix_caching,
                          kv_cache_metrics=args.kv_cache_metrics)
    params: dict[str, Any] = {}
    if args.rate is not None and args.workload != "none":
        params["rate" if args.workload == "synthetic" else "rate_scale"] = args.rate
    return [
        SimConfig(model_name=args.model_name, port=args.port + i if args.port else 0,
                  engine=engine, workload=args.workload, workload_params=params,
                  faults=faults, names=args.names, speed=args.speed, seed=args.seed + i,
                  cpu_share=CPU_SHARE / args.count,
                  kv_events_port=_port(args.kv_events_port, i),
                  kv_events_replay_port=_port(args.kv_events_replay_port, i) or 0)
        for i in range(args.count)
    ]


def _port(first: int | None, i: int) -> int | None:
    """Server i's port from the first (0: ephemeral for all; None: off)."""
    return first + i if first else first


def run(args: argparse.Namespace) -> int:
    from kvtop.sim.server import SimFleet

    try:
        configs = configs_from_args(args)
        fleet = SimFleet(configs)  # loads traces now, so a missing one fails before serving
    except FileNotFoundError as exc:
        print(display_text(f"kvtop sim: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    code = EXIT_OK
    with contextlib.suppress(KeyboardInterrupt):  # where signal handlers can't be set
        code = asyncio.run(_serve(fleet))
    # The servers are closed. What is left is the interpreter's teardown, whose garbage
    # collections over every object alive took 1.3-5.9 s on a loaded 2-core machine (load
    # 14) and 0.15 s of CPU when idle; frozen objects are not scanned (0.03 s), so a stop
    # signal ends the process within a fraction of a second whatever the load.
    gc.freeze()
    return code


async def _serve(fleet: SimFleet) -> int:
    from kvtop.collect.clock import stop_event

    try:
        await fleet.start()
    except OSError as exc:
        print(display_text(f"kvtop sim: cannot listen: {exc}"), file=sys.stderr)
        return EXIT_CANNOT_LISTEN
    stop = stop_event()  # SIGINT/SIGTERM end the wait below, not a KeyboardInterrupt
    for server in fleet.servers:
        events = server.kv_events
        extra = f" kv-events {events.url} replay {events.replay_url}" if events else ""
        print(display_text(f"{server.url}/metrics{extra}"), flush=True)
    try:
        await stop.wait()
    finally:
        await fleet.stop()
    return EXIT_OK
