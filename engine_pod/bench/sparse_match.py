"""How close each head-sparse selection stays to the dense cache: the held-out tasks of ``dllm eval`` under
BlockServe, once with the dense dual cache and once per cache, each compared with the dense run token by
token (scripts/head_sparse_match.py prints the table; docs/head_sparse.md has its figures).

Caches at each retention r: ours (head-centric and uniform, scored by attention probability, with
cross-step consistency) and dLLM-Serve's published selection (uniform groups, the block's mean query's
pre-softmax logits pooled over 3 positions, selected one full forward into the block, no consistency),
per head and shared by a layer's heads; each at the same ratio r, and the uniform ones also at the kept
share head-centric has at r (the same kept bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dllm_contracts.head_sparse_config import HeadSparseConfig

# dLLM-Serve's published selection (its SparseConfig's defaults: pool_kernel 3, delay_step 1)
AUTHORS = {"scoring": "mean-query-logit", "pool_kernel": 3, "selection_delay": 1, "consistency": 1.0}
END = -1  # the end of an answer, compared as a token (an answer that stops early differs there)


@dataclass(frozen=True)
class Contender:
    name: str  # the table's row label
    basis: str  # "ratio" (at r) or "bytes" (at head-centric's kept share at r)
    target: float  # the r it stands for
    sparse: HeadSparseConfig


def contenders(retentions: list[float], kv_heads: int, importance: str | None) -> list[Contender]:
    """Every cache the table compares (the dense one aside), in table order."""
    out: list[Contender] = []
    for r in retentions:
        centric = HeadSparseConfig(mode="head-centric", retention=r, importance=importance)
        share = round(centric.context_kept_share(kv_heads), 4)
        ours = HeadSparseConfig(mode="uniform", retention=r)
        out += [
            Contender("head-centric (ours)", "ratio", r, centric),
            Contender("uniform (ours)", "ratio", r, ours),
            Contender("dLLM-Serve's, per head", "ratio", r, replace(ours, **AUTHORS)),
            Contender("dLLM-Serve's, shared", "ratio", r, replace(ours, **AUTHORS, selection="shared")),
        ]
        at_bytes = replace(ours, retention=share)
        out += [
            Contender("uniform (ours)", "bytes", r, at_bytes),
            Contender("dLLM-Serve's, per head", "bytes", r, replace(at_bytes, **AUTHORS)),
            Contender("dLLM-Serve's, shared", "bytes", r, replace(at_bytes, **AUTHORS, selection="shared")),
        ]
    return out


def token_match(dense: list[list[int]], other: list[list[int]]) -> float:
    """The share of the dense run's greedy tokens (each answer up to its end, the end counted as a token)
    that the other run gives at the same place, over the places either answer has."""
    same = total = 0
    for a, b in zip(dense, other, strict=True):
        a, b = a + [END], b + [END]
        total += max(len(a), len(b))
        same += sum(x == y for x, y in zip(a, b))
    return same / total if total else 1.0


def answers_identical(dense: list[list[int]], other: list[list[int]]) -> float:
    """The share of answers identical to the dense run's."""
    return sum(a == b for a, b in zip(dense, other, strict=True)) / max(len(dense), 1)
