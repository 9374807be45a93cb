"""``dllm bench``'s online load: its flags, their checks and the run (requests arriving over time)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine_pod.bench.policy_caches import split_policy
from engine_pod.bench.run_clock import CLOCKS
from engine_pod.cli.budget import read_profile
from engine_pod.cli.common import CliError


def add_online_args(parser: argparse.ArgumentParser) -> None:
    """The flags of an online load: arrivals, clients, the requests, the clock and a running server."""
    online = parser.add_argument_group(
        "online load",
        "requests arrive over time instead of all at once: every policy (gateway: the whole serving path) "
        "sees the same arrivals; reported: throughput, time to the first committed block, latency "
        "percentiles per task family, queue wait",
    )
    online.add_argument(
        "--arrival-rate", help="Poisson arrivals (seeded), requests per second; comma-separated for several"
    )
    online.add_argument(
        "--concurrency", type=int, help="closed loop: this many clients, one request each at a time"
    )
    online.add_argument("--requests", type=int, help="requests per load, cycling through the workload")
    online.add_argument(
        "--clock",
        choices=CLOCKS,
        default="wall",
        help="what the engine-alone runs are timed by: wall (default) or engine-cpu, the engine process's "
        "CPU seconds with the idle time to the next arrival skipped: on a host shared with other work, "
        "the latencies and throughput an idle core would give (needs --threads 1)",
    )
    online.add_argument(
        "--url",
        help="load this running server (e.g. `dllm serve`) with chat requests instead of the policies",
    )
    online.add_argument("--api-key", help="bearer key for --url")
    online.add_argument(
        "--served-model-name",
        help="model name sent to --url (default: the one the server lists at /v1/models)",
    )


def _loads(args: argparse.Namespace) -> tuple:
    from engine_pod.bench.online import Load

    if args.arrival_rate and args.concurrency:
        raise CliError("use either --arrival-rate or --concurrency")
    try:
        if args.concurrency is not None:
            return (Load(concurrency=args.concurrency),)
        rates = [float(part) for part in args.arrival_rate.split(",") if part.strip()]
        return tuple(Load(rate=rate) for rate in rates)
    except ValueError as exc:
        raise CliError(f"--arrival-rate/--concurrency: {exc}") from exc


def run_online(args: argparse.Namespace, policies: tuple[str, ...], threads, settings: dict) -> int:
    """``dllm bench`` under --arrival-rate or --concurrency: every run, its summary and its JSON."""
    from engine_pod.bench.http_client import HttpError
    from engine_pod.bench.online_bench import OnlineConfig, run_online_benchmark
    from engine_pod.bench.online_http import served_model
    from engine_pod.bench.online_summary import add_memory_bounds, online_summary

    if args.requests is not None and args.requests < 1:
        raise CliError("--requests must be positive")
    for flag, choices in (
        ("--prefix-cache", args.prefix_cache),
        ("--batch-invariant", args.batch_invariant),
    ):
        if len(choices) > 1:
            raise CliError(f"{flag} on,off compares the policies offline; an online load takes on or off")
    if args.clock != "wall":
        gateway = [p for p in policies if split_policy(p)[0].startswith("gateway")]
        if args.url or gateway:
            where = "--url" if args.url else f"--policy {gateway[0]}"
            raise CliError(f"--clock {args.clock} times the engine alone; {where} runs on the wall's clock")
        if threads is None or threads.threads != 1 or threads.follow is not None:
            raise CliError(f"--clock {args.clock} counts one thread's CPU seconds: add --threads 1")
    if args.url and len(args.prefill_chunk) > 1:
        raise CliError("--prefill-chunk: a running server (--url) has its own; give one size or none")
    model = served_model(args.url, args.api_key, args.served_model_name) if args.url else "bench"
    config = OnlineConfig(
        **settings,
        loads=_loads(args),
        prefill_chunks=args.prefill_chunk,
        requests=args.requests,
        url=args.url,
        api_key=args.api_key,
        served_model=model,
        isolate=not args.no_isolate,
        clock=args.clock,
    )
    out = Path(args.json_out) if args.json_out else None

    profile = read_profile(args.profile) if args.profile else None

    def write(report: dict) -> None:
        add_memory_bounds(report, profile)
        report["torch_threads"] = threads.as_dict() if threads else None
        if out:
            out.write_text(json.dumps(report, indent=2) + "\n")

    try:
        report = run_online_benchmark(config, on_run=write)
    except HttpError as exc:  # the server refused a request of the load
        raise CliError(f"{args.url or 'the gateway'}: {exc}") from None
    if args.plot:
        from engine_pod.bench.plots import plot_online

        plot_online(report, Path(args.plot))
    add_memory_bounds(report, profile)
    sys.stdout.write((threads.log_line() + "\n" if threads else "") + online_summary(report) + "\n")
    return 0
