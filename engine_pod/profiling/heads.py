"""The heads' importance a profile stores (``dllm profile --score-heads``): ``dllm heads``' report, so that
``--sparse-cache head-centric`` can take it from ``--profile`` alone; and the head-sparse settings a
profile measures with (``dllm profile --sparse-cache``: a head-centric one without ``--head-importance``
scores the heads first and measures with that importance).

Scored in a spawned process, as the grid's CPU points are measured: its memory (and on CUDA its context)
is gone before the profile measures anything.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dllm_contracts.run_rules import sparse_family_problem
from engine_pod.isolation import ChildDied, run_in_child


class HeadScoreError(ValueError):
    """The heads could not be scored (a family without head importance, a model without tokenizer)."""


def score_heads(model: str, device: str, dtype: str, family: str | None, examples: int) -> dict:
    """``dllm heads``' report for the model, with its default calibration of ``examples`` examples."""
    try:
        outcome = run_in_child(_score, model, device, dtype, family, examples)
    except ChildDied as exc:
        raise HeadScoreError(f"scoring the heads' importance failed ({exc})") from None
    if isinstance(outcome, str):
        raise HeadScoreError(outcome)
    return outcome


def _score(model: str, device: str, dtype: str, family: str | None, examples: int) -> dict | str:
    """In the child: the report, or why not (one line, never a traceback from the child)."""
    from engine_pod.loading.loader import load_model
    from engine_pod.profiling.head_importance import ImportanceConfig, head_importance

    try:
        loaded = load_model(model, device, dtype, family=family)
        return head_importance(loaded, ImportanceConfig(examples=examples))
    except (ValueError, OSError) as exc:
        return f"--score-heads: {exc}"


def profile_heads(args: argparse.Namespace, scratch: Path) -> tuple[dict | None, str | None]:
    """What a profile stores of the heads (None: nothing) and the importance file it measures head-centric
    groups with: --head-importance's, else the heads scored here, written under ``scratch`` for the grid's
    processes to read."""
    if args.head_importance:
        from engine_pod.kinds.bidirectional.head_sparse.groups import importance_report

        return importance_report(args.head_importance), args.head_importance
    if not (args.score_heads or args.sparse_cache == "head-centric"):
        return None, None
    report = score_heads(args.model, args.device, args.dtype, args.family, args.heads_examples)
    scored = scratch / "heads.json"
    scored.write_text(json.dumps(report))
    return report, str(scored)


def check_sparse_family(model: str, family: str | None) -> None:
    """The head-sparse cache's family, refused in one line before anything is scored or measured."""
    from engine_pod.families.registry import family_of
    from engine_pod.loading.loader import load_metadata

    record = family_of(load_metadata(model, family)[0])
    problem = sparse_family_problem(record.display_name, record.kind.name)
    if problem:
        raise HeadScoreError(problem)
