"""``dllm profile``: measure peak memory over batch shapes and write the token budget."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from dllm_contracts.head_sparse_config import memory_settings
from dllm_contracts.profile_summary import ProfileSummary, failure_message
from dllm_contracts.scheduler_config import DEFAULT_LAYOUT, LAYOUTS
from engine_pod.cli.common import (
    CliError,
    add_batch_invariant_arg,
    add_logit_args,
    add_model_args,
    add_tensor_parallel_arg,
    check_logit_args,
    group_place,
)
from engine_pod.cli.sparse_args import add_sparse_args, sparse_config
from engine_pod.cpu_load import apply_threads
from engine_pod.kinds.bidirectional.head_sparse.groups import PROFILE_KEY

logger = logging.getLogger(__name__)

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """``1073741824``, ``1024M``, ``1.5GiB`` or ``2G`` -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not match:
        raise CliError(f"cannot read a memory size from {text!r} (use bytes, or a K/M/G/T suffix)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="turn a device into a token budget",
        description="Run real block cycles over a grid of batch shapes, record each one's peak memory "
        "(CUDA: allocator peak; CPU: peak resident memory of a child process per shape), fit "
        "peak = weights + a + b x tokens and write the token budget that fits the usable memory.",
    )
    add_model_args(parser)
    add_tensor_parallel_arg(parser)
    parser.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="M",
        help="machines the group spans: 1 only, a profile measures a group on one machine; a group over "
        "several machines takes --token-budget (default: 1)",
    )
    limit = parser.add_mutually_exclusive_group()
    limit.add_argument(
        "--memory-limit",
        type=parse_bytes,
        help="usable bytes (e.g. 2G); default: device memory x utilization",
    )
    limit.add_argument(
        "--utilization", type=float, default=0.9, help="share of device memory to use (default: 0.9)"
    )
    parser.add_argument(
        "--block-length", type=int, help="block length L (default: 32; DiffusionGemma: its canvas length)"
    )
    parser.add_argument(
        "--steps", type=int, default=4, help="denoising steps per profiled block cycle (default: 4)"
    )
    parser.add_argument(
        "--max-tokens", type=int, help="largest grid batch in tokens (default: 16384 CPU, 65536 CUDA)"
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=DEFAULT_LAYOUT,
        help=f"the batch layout the engine will run (default: {DEFAULT_LAYOUT}); see `dllm worker --help`",
    )
    add_logit_args(parser)
    add_batch_invariant_arg(parser)
    parser.add_argument(
        "--score-heads",
        action="store_true",
        help="also score each attention head's importance as `dllm heads` does (LLaDA, Dream) and store it "
        "in the --json result, where `--profile FILE --sparse-cache head-centric` takes it from",
    )
    parser.add_argument(
        "--heads-examples",
        type=int,
        default=256,
        metavar="N",
        help="calibration examples of --score-heads (default: 256, as `dllm heads`)",
    )
    add_sparse_args(parser)
    parser.add_argument(
        "--json",
        dest="json_out",
        metavar="PATH",
        help="also write the full result here (the grid, the fit, the budget): what `dllm bench --profile` "
        "and `dllm worker --profile` read; the budget is printed either way",
    )
    parser.add_argument(
        "--termination-log", help="also write a compact result here (Kubernetes termination message)"
    )
    parser.set_defaults(handler=run)


def _error_message(exc: Exception) -> str:
    """The failure as termination-message JSON."""
    return failure_message(str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}")


def run_profile(config):
    """The profiler (imported here: ``dllm --help`` must not load torch)."""
    from engine_pod.profiling.profiler import run_profile as profile

    return profile(config)


def _measure(args: argparse.Namespace, config) -> dict:
    """The result: the heads scored first where asked (or needed: head-centric without --head-importance),
    the grid measured with the head-sparse cache the flags set."""
    from engine_pod.profiling.heads import check_sparse_family, profile_heads

    if args.sparse_cache != "off":  # refused before the heads are scored or a point measured
        sparse_config(argparse.Namespace(**vars(args) | {"head_importance": args.head_importance or "-"}))
        check_sparse_family(args.model, args.family)
    with tempfile.TemporaryDirectory(prefix="dllm-profile-") as scratch:
        heads, importance = profile_heads(args, Path(scratch))
        sparse = sparse_config(argparse.Namespace(**vars(args) | {"head_importance": importance}))
        result = run_profile(replace(config, sparse=sparse)) | {
            "tensor_parallel": args.tensor_parallel,
            "expert_parallel": args.expert_parallel,
            "max_materialized_logits": args.max_materialized_logits,
            "logit_candidates": args.logit_candidates,
            "batch_invariant": args.batch_invariant[0],
        }  # the size measured at
    settings = memory_settings(asdict(sparse))
    return result | ({"sparse_cache": settings} if settings else {}) | ({PROFILE_KEY: heads} if heads else {})


def run(args: argparse.Namespace) -> int:
    from engine_pod.profiling.profiler import ProfileConfig

    if args.nodes != 1:
        raise CliError(
            f"--nodes {args.nodes}: dllm profile measures a group on one machine only; profile "
            f"--tensor-parallel {args.tensor_parallel} on one machine that holds the whole group, or give the "
            "workers of a group over several machines --token-budget (a DLLMService: profiling.tokenBudget)"
        )
    place = group_place(args)  # sizes that make no group: refused in one line
    apply_threads(args.threads)
    if not 0 < args.utilization <= 1:
        raise CliError(f"--utilization must be in (0, 1], got {args.utilization}")
    if (args.block_length is not None and args.block_length < 1) or args.steps < 1:
        raise CliError("--block-length and --steps must be positive")
    check_logit_args(args)
    if args.score_heads and not args.json_out:
        raise CliError("--score-heads stores the heads' importance in the --json result: pass --json PATH")
    if args.score_heads and place.size != 1:
        raise CliError("--score-heads scores the heads in one process: profile with --tensor-parallel 1")
    if args.heads_examples < 1:
        raise CliError(f"--heads-examples must be positive, got {args.heads_examples}")
    if args.sparse_cache != "off" and args.layout != "packed":
        raise CliError("--sparse-cache runs packed rows only: drop --layout dense")
    if args.sparse_cache != "off" and place.size != 1:
        raise CliError("--sparse-cache runs in one process: profile with --tensor-parallel 1")
    max_tokens = args.max_tokens or (65536 if args.device.startswith("cuda") else 16384)
    if args.block_length is not None and max_tokens < 4 * args.block_length:  # else checked with the model's
        raise CliError(f"--max-tokens must be at least {4 * args.block_length}")
    config = ProfileConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        block_length=args.block_length,
        steps=args.steps,
        memory_limit=args.memory_limit,
        utilization=args.utilization,
        max_tokens=max_tokens,
        layout=args.layout,
        family=args.family,
        tensor_parallel=args.tensor_parallel,
        expert_parallel=args.expert_parallel,
        max_materialized_logits=args.max_materialized_logits,
        logit_candidates=args.logit_candidates,
        batch_invariant=args.batch_invariant[0],
    )
    try:
        result = _measure(args, config)
    except Exception as exc:  # any failure (a bad limit, CUDA out of memory, a missing model): say why
        if args.termination_log:  # the operator reads why from the pod status
            Path(args.termination_log).write_text(_error_message(exc))
        raise
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    if args.termination_log:  # the operator reads the summary from the pod status
        Path(args.termination_log).write_text(ProfileSummary.from_result(result).termination_message())
    for warning in result["warnings"]:
        logger.warning(warning)
    fit = result["fit"]
    sys.stdout.write(
        f"token budget {result['token_budget']} ({fit['bytes_per_token']:.0f} bytes/token, "
        f"R^2 {fit['r_squared']:.4f}, held-out error "
        f"{max(h['relative_error'] for h in result['held_out']):.1%})\n"
        f"measured on {result['device_name']} ({result['device']}), {result['allocator']}: "
        "another device or allocator needs its own profile\n"
    )
    return 0
