"""``dllm census``: what each policy's block cycles ask of the device, counted at torch's dispatcher
(engine_pod/bench/census_run.py)."""

from __future__ import annotations

import argparse
import json
import sys

from engine_pod.bench.census_grid import MODELS, POLICIES, REQUESTS
from engine_pod.cli.common import CliError, parse_int_list


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "census",
        help="count attention calls, device syncs and host-to-device copies per forward and cycle",
        description="Run block cycles of each policy and count, at torch's dispatcher, what they ask of the "
        "device: attention calls per layer, syncs (reads back to the host) per forward and per denoising "
        "step, host-to-device copies per cycle, new attention shapes, the operations of a first forward and "
        "of each MoE layer. A CPU stands in for the GPU: the operations are the same. Each scenario logs a "
        "line as it ends (its worst forward, step and cycle); the table of each model's and policy's worst "
        "cases over the mixes is printed at the end.",
    )
    parser.add_argument(
        "--model",
        action="append",
        help=f"model spec, repeatable (default: one CPU-sized model per family: {', '.join(MODELS)})",
    )
    parser.add_argument(
        "--requests",
        default=",".join(REQUESTS),
        help="what the rows' requests ask, comma-separated: greedy, sampled (temperature, top-p, top-k, a seed "
        "per row), logprobs, constrained (every other row's answer keeps to a JSON schema) "
        f"(default: {','.join(REQUESTS)})",
    )
    parser.add_argument(
        "--policy",
        action="append",
        help="static, blockserve-packed or blockserve-dense; repeatable (default: all)",
    )
    parser.add_argument("--rows", default="4,16,32", help="row counts, comma-separated (default: 4,16,32)")
    parser.add_argument(
        "--distinct",
        default="1,4,all",
        help="distinct prompt lengths per batch; 'all': one per row (default: 1,4,all)",
    )
    parser.add_argument(
        "--cycles", type=int, default=3, help="cycles per scenario, the first a warm-up (default: 3)"
    )
    parser.add_argument("--json", help="write every scenario's figures to this file")
    parser.add_argument(
        "--markdown",
        help="also write the table printed at the end (each model's and policy's worst case) here",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine_pod.bench.census_run import markdown_table, run_census

    unknown = sorted(set(args.policy or ()) - set(POLICIES))
    if unknown:
        raise CliError(f"--policy {', '.join(unknown)}: choose from {', '.join(sorted(POLICIES))}")
    distinct = [part.strip() for part in args.distinct.split(",") if part.strip()]
    if not distinct or any(part != "all" and not part.isdigit() for part in distinct):
        raise CliError(f"--distinct takes counts or 'all', comma-separated; got {args.distinct!r}")
    if args.cycles < 2:
        raise CliError("--cycles must be at least 2 (the first is the warm-up)")
    rows = parse_int_list(args.rows, "--rows")
    requests = tuple(part.strip() for part in args.requests.split(",") if part.strip())
    if not requests or set(requests) - set(REQUESTS):
        raise CliError(f"--requests takes {', '.join(REQUESTS)}, comma-separated; got {args.requests!r}")
    results = run_census(
        args.model or list(MODELS), args.policy or sorted(POLICIES), rows, distinct, args.cycles, requests
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    table = markdown_table(results)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(table)
    sys.stdout.write(table)
    return 0
