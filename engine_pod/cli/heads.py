"""``dllm heads``: each attention head's importance, the head-centric sparse cache's input."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from engine_pod.cli.common import CliError, add_model_args
from engine_pod.cpu_load import apply_threads
from engine_pod.synthetic.tasks import TASKS, parse_tasks

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "heads",
        help="score each attention head's importance (for --sparse-cache head-centric)",
        description="Score every attention head of a LLaDA or Dream model: the L2 norm of the masked-diffusion "
        "loss's gradient with respect to the head's columns of the output projection, over a seeded "
        "calibration set of the synthetic tasks' training split, divided by its layer's sum. Writes a JSON "
        "file that `--sparse-cache head-centric --head-importance FILE` reads.",
    )
    add_model_args(parser)
    parser.add_argument("--out", default="head_importance.json", help="where to write the scores")
    parser.add_argument("--examples", type=int, default=256, help="calibration examples (default: 256)")
    parser.add_argument("--seed", type=int, default=0, help="which calibration examples (default: 0)")
    parser.add_argument("--tasks", help=f"comma-separated, from {', '.join(TASKS)} (default: all of these)")
    parser.add_argument(
        "--block-length", type=int, default=32, help="block length of the masking (default: 32)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine_pod.loading.loader import load_model
    from engine_pod.profiling.head_importance import ImportanceConfig, head_importance

    apply_threads(args.threads, logging.DEBUG)
    if args.block_length < 1:
        raise CliError("--block-length must be positive")
    cfg = ImportanceConfig(examples=args.examples, seed=args.seed, tasks=parse_tasks(args.tasks))
    loaded = load_model(args.model, args.device, args.dtype, family=args.family)
    report = head_importance(loaded, cfg, args.block_length)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    logger.info(
        "wrote head importance of %d layers x %d heads to %s", report["layers"], report["heads"], args.out
    )
    sys.stdout.write(args.out + "\n")
    return 0
