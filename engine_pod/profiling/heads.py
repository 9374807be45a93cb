"""The heads' importance a profile stores (``dllm profile --score-heads``): ``dllm heads``' report, so that
``--sparse-cache head-centric`` can take it from ``--profile`` alone.

Scored in a spawned process, as the grid's CPU points are measured: its memory (and on CUDA its context)
is gone before the profile measures anything.
"""

from __future__ import annotations

import json
from pathlib import Path

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
    from engine_pod.head_sparse.importance import ImportanceConfig, head_importance
    from engine_pod.loading.loader import load_model

    try:
        loaded = load_model(model, device, dtype, family=family)
        return head_importance(loaded, ImportanceConfig(examples=examples))
    except (ValueError, OSError) as exc:
        return f"--score-heads: {exc}"


def read_report(path: str) -> dict:
    """The report in a ``dllm heads`` file, or in a ``dllm profile`` result that stores one."""
    from engine_pod.head_sparse.groups import PROFILE_KEY

    try:
        data = json.loads(Path(path).read_text())
        report = data.get(PROFILE_KEY, data)
        if not isinstance(report.get("importance"), list):
            raise KeyError("importance")
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise HeadScoreError(f"cannot read head importance from {path}: {exc}") from None
    return report
