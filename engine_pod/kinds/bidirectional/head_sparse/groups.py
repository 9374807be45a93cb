"""Which heads of a layer keep how much (torch-free): head groups and kept counts.

A group is a set of a layer's K/V heads with one retention, so every head of a group keeps the same
number of positions of a row: its entries of all rows form one compact store and one attention call.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dllm_contracts.head_sparse_config import HeadSparseConfig, HeadSparseConfigError


@dataclass(frozen=True)
class HeadGroup:
    name: str  # core, regular, minor (head-centric) or all (uniform)
    retention: float  # share of each row's context its heads keep
    heads: tuple[int, ...]  # the layer's K/V heads in the group, ascending


def kept_context(retention: float, context: int) -> int:
    """Context positions a head at ``retention`` keeps of a row with ``context`` of them:
    ceil(retention x context), computed without the float's last-bit noise (0.3 x 10 keeps 3)."""
    return min(context, math.ceil(round(retention * context, 9)))


def layer_groups(config: HeadSparseConfig, importance: list[float] | None, heads: int) -> list[HeadGroup]:
    """One layer's non-empty groups. Head-centric: heads ranked by ``importance`` (one score per K/V head,
    ties to the lower head), the most important core share kept whole, the least important minor share at
    the minor retention, the rest at ``retention``."""
    if config.mode == "uniform":
        return [HeadGroup("all", config.retention, tuple(range(heads)))]
    if importance is None or len(importance) != heads:
        raise HeadSparseConfigError(f"head-centric groups need one importance per head ({heads})")
    ranked = sorted(range(heads), key=lambda h: (-importance[h], h))
    core, _, minor = config.group_sizes(heads)  # the shares rounded half up, as admission counts them
    parts = (ranked[:core], ranked[core : heads - minor], ranked[heads - minor :])
    names = ("core", "regular", "minor")
    return [
        HeadGroup(name, retention, tuple(sorted(part)))
        for name, retention, part in zip(names, config.group_retentions(), parts)
        if part
    ]


def model_groups(
    config: HeadSparseConfig, layers: int, heads: int, queries_per_head: int = 1
) -> list[list[HeadGroup]]:
    """Every layer's groups; head-centric reads the importance file (its query heads' scores summed over
    each K/V head's ``queries_per_head``)."""
    if config.mode != "head-centric":
        return [layer_groups(config, None, heads) for _ in range(layers)]
    scores = read_importance(config.importance, layers, heads * queries_per_head)
    per_kv = [
        [sum(layer[h * queries_per_head : (h + 1) * queries_per_head]) for h in range(heads)]
        for layer in scores
    ]
    return [layer_groups(config, layer, heads) for layer in per_kv]


PROFILE_KEY = "head_importance"  # where a `dllm profile` result holds `dllm heads`' report


def importance_report(path: str | None) -> dict:
    """``dllm heads``' report in a file it wrote, or in a ``dllm profile`` result that stores one."""
    try:
        data = json.loads(Path(str(path)).read_text())
        report = data.get(PROFILE_KEY, data)
        if not isinstance(report.get("importance"), list):
            raise KeyError("importance")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise HeadSparseConfigError(f"cannot read head importance from {path}: {error}") from None
    return report


def read_importance(path: str | None, layers: int, heads: int) -> list[list[float]]:
    """The per-layer, per-head scores of ``importance_report``, checked against the model's shape."""
    scores = importance_report(path)["importance"]
    if len(scores) != layers or any(len(layer) != heads for layer in scores):
        raise HeadSparseConfigError(
            f"head importance in {path} is not for this model ({layers} layers of {heads} heads)"
        )
    return [[float(s) for s in layer] for layer in scores]


def profile_has_importance(path: str) -> bool:
    """Whether a ``dllm profile`` result stores the heads' importance (a file that cannot be read: no; the
    budget's reader says why)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get(PROFILE_KEY), dict)
