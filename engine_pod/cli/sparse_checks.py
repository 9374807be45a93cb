"""The head-sparse cache's run rules, refused in one line before a command starts any process: a dual-cache
family (LLaDA, Dream) in one process (no tensor parallelism)."""

from __future__ import annotations

import argparse

from engine_pod.cli.common import CliError


def check_sparse_run(args: argparse.Namespace, sparse_on: bool = False) -> None:
    """``--sparse-cache`` (or, ``sparse_on``, a run's own sparse cache) with the command's model and
    ``--tensor-parallel`` (nothing when it is off)."""
    if getattr(args, "sparse_cache", "off") == "off" and not sparse_on:
        return
    from engine_pod.profiling.heads import check_sparse_family

    if getattr(args, "tensor_parallel", 1) != 1:
        raise CliError(
            f"--sparse-cache runs in one process: run with --tensor-parallel 1, not {args.tensor_parallel}"
        )
    check_sparse_family(args.model, args.family)
