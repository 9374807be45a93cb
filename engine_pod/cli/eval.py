"""``dllm eval``: exact match and length accuracy on held-out synthetic tasks."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from engine_pod.cli.budget import add_budget_args, resolve_budget
from engine_pod.cli.common import (
    CliError,
    add_decoding_args,
    add_model_args,
    check_logit_args,
    decoding_config,
)
from engine_pod.cli.sparse_args import add_sparse_args
from engine_pod.cpu_load import apply_threads
from engine_pod.synthetic.tasks import EXTRA_TASKS, TASKS, parse_tasks

POLICIES = ("sequential", "static", "blockserve")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="score a model on held-out synthetic tasks",
        description="Generate answers for held-out examples of every task family and report exact match, "
        "length accuracy (EOS exactly where the reference answer ends) and per-task figures. Several "
        "policies can be compared in one run (their outputs should agree).",
    )
    add_model_args(parser)
    parser.add_argument(
        "--n", type=int, default=140, help="examples, spread evenly over the tasks (default: 140)"
    )
    parser.add_argument("--seed", type=int, default=1234, help="which held-out examples (default: 1234)")
    parser.add_argument(
        "--tasks",
        help=f"comma-separated, from {', '.join(TASKS)} (default: all of these) "
        f"or the set-aside {', '.join(EXTRA_TASKS)}",
    )
    parser.add_argument("--policy", default="blockserve", help=f"comma-separated, from {', '.join(POLICIES)}")
    parser.add_argument(
        "--max-tokens", type=int, default=128, help="generation budget per example (default: 128)"
    )
    parser.add_argument(
        "--steps-per-block", type=int, default=32, help="denoising steps per block (default: 32)"
    )
    add_budget_args(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--outputs", help="write every example's generated text to this JSONL file")
    add_decoding_args(parser)
    add_sparse_args(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine_pod.evaluation import EvalConfig, evaluate, write_outputs
    from engine_pod.loading.loader import load_model

    check_logit_args(args)
    apply_threads(args.threads, logging.DEBUG)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if not policies or any(p not in POLICIES for p in policies):
        raise CliError(f"--policy takes a comma-separated list from {', '.join(POLICIES)}")
    tasks = parse_tasks(args.tasks)
    if args.n < 1:
        raise CliError("--n must be positive")
    loaded = load_model(args.model, args.device, args.dtype, family=args.family)
    cfg = EvalConfig(
        n=args.n, seed=args.seed, max_tokens=args.max_tokens, token_budget=resolve_budget(args), tasks=tasks
    )
    report = evaluate(loaded, decoding_config(args, args.steps_per_block), policies, cfg)
    if args.outputs:
        write_outputs(report, Path(args.outputs))
    report.pop("_outputs")
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        _print_table(report)
    return 0


def _print_table(report: dict) -> None:
    lines = []
    for policy, figures in report["policies"].items():
        lines.append(
            f"{policy}: exact match {figures['exact_match']:.3f}, length accuracy {figures['length_accuracy']:.3f}"
        )
        for task, f in figures["per_task"].items():
            lines.append(
                f"  {task:<10} n={f['n']:<4} exact {f['exact_match']:.3f}  length {f['length_accuracy']:.3f}"
            )
    for policy, value in report.get("output_agreement", {}).items():
        lines.append(f"outputs of {policy} identical to {report['agreement_with']}: {value:.1%}")
    sys.stdout.write("\n".join(lines) + "\n")
