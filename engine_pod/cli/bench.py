"""``dllm bench``: compare sequential, static and BlockServe scheduling on one workload."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

from engine_pod.bench.policies import POLICIES
from engine_pod.bench.policy_caches import cache_config, split_policy
from engine_pod.bench.workloads import named_workloads
from engine_pod.cli.bench_online import add_online_args, run_online
from engine_pod.cli.bench_summary import summary_text
from engine_pod.cli.budget import read_profile
from engine_pod.cli.common import (
    CliError,
    add_decoding_args,
    add_model_args,
    add_tensor_parallel_arg,
    check_logit_args,
    decoding_config,
    group_place,
)
from engine_pod.cli.scheduling import add_scheduler_args, check_stagger, scheduler_config
from engine_pod.cli.sparse_args import add_sparse_args
from engine_pod.cli.sparse_checks import check_sparse_run
from engine_pod.cpu_load import apply_threads
from engine_pod.cpu_threads import PINNED

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark scheduling policies side by side",
        description="Run a workload under each policy in the same run and report throughput, latency, "
        "padding efficiency, memory, and whether every request's output is identical across policies. "
        f"Named workloads: {', '.join(named_workloads())}; or synthetic:n=64,prompt=4-300,gen=32-128,seed=0; "
        "shared-prefix:n=64,prefix=1024,question=16-64,gen=32-64,seed=0 (one long prefix before every "
        "question); multi-turn:conversations=16,turns=4,message=32-128,gen=32-64,seed=0 (chats whose every "
        "turn resends the history); or a JSONL trace with prompt/prompt_tokens and max_tokens per line.",
    )
    add_model_args(parser)
    parser.add_argument(
        "--workload", default="heterogeneous", help="named workload, synthetic spec or JSONL path"
    )
    parser.add_argument(
        "--policy",
        default="sequential,static,blockserve",
        help=f"comma-separated, from: {', '.join(POLICIES)}; under --arrival-rate/--concurrency a policy "
        "may name its own cache, policy:dense, policy:uniform@R or policy:head-centric@R (R the retention; "
        "the other head-sparse settings are the flags'), e.g. blockserve:dense,dllm-serve:dense,"
        "dllm-serve:uniform@0.3",
    )
    parser.add_argument(
        "--batch-size", type=int, help="static batch size (default: largest that fits the budget)"
    )
    add_scheduler_args(parser, compare=True)
    parser.add_argument(
        "--steps-per-block", type=int, default=32, help="denoising steps per block (default: 32)"
    )
    parser.add_argument("--limit", type=int, help="use only the first N requests")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the policies N times, round-robin (each round starting one policy later), and report each one's median run (default: 1)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the engine on one core with one torch thread, and the serving path (gateway, Redis, the "
        "client) on the others: the gateway policies' figure is then not decided by how the host shares "
        "its cores (on a GPU host the forwards do not use the gateway's cores)",
    )
    parser.add_argument("--no-isolate", action="store_true", help="run every policy in this process")
    parser.add_argument(
        "--no-margins",
        action="store_true",
        help="skip recording top-2 gaps (used to explain diverging outputs)",
    )
    parser.add_argument(
        "--calibrate-threshold",
        type=float,
        metavar="FRACTION",
        help="set the confidence threshold to the level that FRACTION of a block's first-forward "
        "confidences reach, so blocks finish early on random weights (whose confidences are near "
        "1/vocabulary); the threshold used is reported",
    )
    parser.add_argument(
        "--json",
        dest="json_out",
        metavar="PATH",
        help="also write the full report here as JSON (rewritten after each policy, so a run cut short keeps "
        "what it measured); the summary table goes to the terminal either way",
    )
    parser.add_argument("--plot", help="write throughput, latency CDF and timeline plots to this PNG")
    add_online_args(parser)
    add_decoding_args(parser, compare=True)
    add_sparse_args(parser)
    add_tensor_parallel_arg(parser)
    parser.set_defaults(handler=run)


def _run_settings(args: argparse.Namespace, policies: tuple[str, ...]) -> dict:
    """What an offline and an online benchmark both take from the command line."""
    return {
        "model": _model_spec(args),
        "workload": args.workload,
        "policies": policies,
        "decoding": decoding_config(args, args.steps_per_block),
        "scheduling": scheduler_config(args),
    }


def _threads(args: argparse.Namespace, online: bool):
    """The engine's torch threads: one under --pin (one core, offline), else the flag, the variable or the
    CPUs."""
    if args.pin and not online:
        if args.threads is not None:
            raise CliError("--threads: --pin runs the engine on one core with one thread")
        choice = PINNED
        logger.info("%s", choice.log_line())
        return choice
    return apply_threads(args.threads)


def _check_policy_caches(args: argparse.Namespace, policies: tuple[str, ...]) -> list:
    """The head-sparse settings of the policies that name their own cache, each refused in one line when
    out of range."""
    from engine_pod.cli.sparse_args import sparse_config

    caches = []
    for entry in policies:
        cache = split_policy(entry)[1]
        if cache is None:
            continue
        try:
            caches.append(cache_config(cache, replace(sparse_config(args), mode="off")))
        except ValueError as exc:
            raise CliError(f"--policy {entry}: {exc}") from None
    return caches


def _model_spec(args: argparse.Namespace):
    from engine_pod.bench.results import ModelSpec

    place = group_place(args)  # sizes that make no group: refused in one line
    return ModelSpec(args.model, args.device, args.dtype, args.family, place.tensor, place.expert)


def run(args: argparse.Namespace) -> int:
    check_logit_args(args)  # flags are refused before torch loads (seconds)
    policies = tuple(p.strip() for p in args.policy.split(",") if p.strip())
    unknown = [p for p in policies if split_policy(p)[0] not in POLICIES]
    if unknown or not policies:
        raise CliError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    own_caches = _check_policy_caches(args, policies)
    if args.batch_size is not None and args.batch_size < 1:
        raise CliError("--batch-size must be positive")
    if args.repeat < 1:
        raise CliError("--repeat must be positive")
    if any(split_policy(p)[0] == "dllm-serve" for p in policies):
        check_stagger(args)
    if not args.url:  # refused here, not in a benchmark child
        check_sparse_run(args, sparse_on=any(c.on for c in own_caches))
    online = bool(args.arrival_rate) or args.concurrency is not None
    if own_caches and not online:
        raise CliError("a policy's own cache (policy:cache) runs under --arrival-rate or --concurrency")
    threads = None if args.url else _threads(args, online)  # --url: the server's engine, not this process
    if online:
        return run_online(args, policies, threads, _run_settings(args, policies))
    if args.url:
        raise CliError("--url needs --arrival-rate or --concurrency")
    if args.clock != "wall":
        raise CliError(f"--clock {args.clock} times online loads (--arrival-rate or --concurrency)")
    if len(args.prefill_chunk) > 1:
        raise CliError(
            "--prefill-chunk: several sizes compare online loads (--arrival-rate or --concurrency)"
        )
    calibrate = args.calibrate_threshold
    if calibrate is not None and not (0 < calibrate < 1 and args.remasking == "threshold"):
        raise CliError("--calibrate-threshold takes a fraction in (0, 1) and needs --remasking threshold")
    from engine_pod.bench.benchmark import BenchConfig, run_benchmark

    config = BenchConfig(
        **_run_settings(args, policies),
        batch_size=args.batch_size,
        limit=args.limit,
        isolate=not args.no_isolate,
        record_margins=not args.no_margins,
        calibrate_fraction=calibrate,
        repeat=args.repeat,
        pin=args.pin,
        prefix_cache=args.prefix_cache,
        batch_invariant=args.batch_invariant,
    )
    usable = read_profile(args.profile).usable_memory_bytes if args.profile else None
    out = Path(args.json_out) if args.json_out else None

    def write(report: dict) -> None:  # after every policy, so a run cut short keeps what it measured
        report["usable_memory_bytes"] = usable
        report["torch_threads"] = threads.as_dict()
        if out:
            out.write_text(json.dumps(report, indent=2) + "\n")
            logger.info("wrote %s (%s)", out, ", ".join(report["policies"]))

    report = run_benchmark(config, on_policy=write)
    if args.plot:
        from engine_pod.bench.plots import plot_benchmark

        plot_benchmark(report, Path(args.plot))
    sys.stdout.write(summary_text(report) + "\n")
    return 0
