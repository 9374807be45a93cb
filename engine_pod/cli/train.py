"""``dllm train``: train the small LLaDA-architecture model on the synthetic tasks."""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

from engine_pod.cpu_threads import parse_threads
from engine_pod.synthetic.tasks import EXTRA_TASKS, TASKS, parse_tasks

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train the small model that ships with the project",
        description="Masked-diffusion SFT of a LLaDA-architecture model on seeded synthetic tasks. "
        "Resumable (--resume), reproducible from --seed; writes OUT/checkpoint in the real LLaDA format "
        "and OUT/loss.png.",
    )
    parser.add_argument("--out", default="runs/train", help="output directory (default: runs/train)")
    parser.add_argument(
        "--steps", type=int, default=5000, help="optimiser steps (default: 5000, the shipped model)"
    )
    parser.add_argument(
        "--tasks",
        help=f"comma-separated task families to train on (default: {', '.join(TASKS)}; "
        f"also {', '.join(EXTRA_TASKS)})",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the weights and of the data (default: 0)"
    )
    parser.add_argument("--max-minutes", type=float, help="stop and export after this many minutes")
    parser.add_argument(
        "--threads",
        metavar="N",
        default="2",
        help="torch threads (default: 2, as the shipped model was trained; $DLLM_THREADS is not read here)",
    )
    parser.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt if present")
    parser.add_argument("--install", action="store_true", help="copy the result over the shipped model")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine_pod.training.train import TrainConfig, Trainer

    if args.steps < 1:
        raise ValueError(f"--steps must be positive, got {args.steps}")
    cfg = TrainConfig(
        out_dir=args.out,
        steps=args.steps,
        seed=args.seed,
        max_minutes=args.max_minutes,
        threads=parse_threads(args.threads, "--threads"),
        tasks=parse_tasks(args.tasks),
    )
    trainer = Trainer(cfg)
    if args.resume:
        trainer.resume()
    checkpoint = trainer.run()
    logger.info("checkpoint written to %s", checkpoint)
    if args.install:
        from dllm_contracts.defaults import DEFAULT_MODEL

        target = Path(DEFAULT_MODEL)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(checkpoint, target)
        logger.info("installed as the default model in %s", target)
    return 0
