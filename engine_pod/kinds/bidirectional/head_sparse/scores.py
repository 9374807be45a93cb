"""What a head attends to at a refresh, and which positions it keeps (vectorised over rows and heads).

Scores come from the refresh's scoring queries of a row (its active block's positions; at the last
layer, the block positions whose logits are computed, the only queries a reuse step's last layer has):
- ``probability``: the mean over those queries of the attention probabilities to each of the row's keys,
  per K/V head (its query heads' probabilities summed);
- ``mean-query-logit``: the pre-softmax logit of their mean query against each key, per K/V head the most
  over its query heads (dLLM-Serve's published selection).
A ``shared`` selection ranks every head of a layer by one score, summed over all query heads. Pooling
gives each context position the most of the scores within the kernel around it, over the row's context
positions only (the active block, always kept, lends its neighbours nothing).

Cross-step consistency: where the request had a refresh before, a head compares its new scores with the
ranking it kept by then, over the positions both saw; above the threshold (cosine), it keeps ranking those
positions as before (its selection stays put) and ranks only the new ones afresh.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def selection_scores(
    queries: torch.Tensor,
    q_valid: torch.Tensor,
    keys: torch.Tensor,
    k_valid: torch.Tensor,
    scale: float,
    scoring: str,
    shared: bool,
) -> torch.Tensor:
    """queries [R, Q, H, hd] (``q_valid`` [R, Q]), keys [R, K, Hkv, hd] (``k_valid`` [R, K]) -> [R, Hkv, K]
    by ``scoring`` (module docstring); ``shared``: every head's row the same, summed over the query heads.
    Zero where a row has no query and at keys that are not the row's."""
    rows, width, heads, dim = queries.shape
    kv_heads = keys.shape[2]
    compute = torch.promote_types(queries.dtype, torch.float32)
    q = queries.to(compute).view(rows, width, kv_heads, heads // kv_heads, dim)
    if scoring == "probability":
        logits = torch.einsum("rqjgd,rkjd->rjgqk", q, keys.to(compute)) * scale
        logits.masked_fill_(~k_valid[:, None, None, None, :], float("-inf"))
        probs = logits.softmax(-1) * q_valid[:, None, None, :, None].to(compute)
        count = q_valid.sum(1).clamp(min=1).to(compute)[:, None, None]
        if shared:
            return (probs.sum((1, 2, 3)) / count[:, 0])[:, None, :].expand(rows, kv_heads, -1)
        return probs.sum((2, 3)) / count
    valid = q_valid[:, :, None, None, None].to(compute)
    mean = (q * valid).sum(1) / q_valid.sum(1).clamp(min=1).to(compute)[:, None, None, None]
    logits = torch.einsum("rjgd,rkjd->rjgk", mean, keys.to(compute)) * scale
    logits = logits.masked_fill(~k_valid[:, None, None, :], 0.0)
    if shared:
        return logits.sum((1, 2))[:, None, :].expand(rows, kv_heads, -1)
    return logits.amax(2)


def pooled(scores: torch.Tensor, context: torch.Tensor, kernel: int) -> torch.Tensor:
    """scores [R, Hkv, K] with each ``context`` [R, K] position's the most of the context scores within
    ``kernel`` (odd) around it; the other positions' unchanged."""
    if kernel <= 1:
        return scores
    rows, heads, width = scores.shape
    inside = scores.masked_fill(~context[:, None], float("-inf")).reshape(rows * heads, 1, width)
    most = F.max_pool1d(inside, kernel, stride=1, padding=kernel // 2).view(rows, heads, width)
    return torch.where(context[:, None], most, scores)


def consistent_ranking(
    scores: torch.Tensor, previous: torch.Tensor, previous_len: torch.Tensor, threshold: float
) -> torch.Tensor:
    """scores [R, Hkv, K] and the ranking each head kept by at the request's previous refresh (``previous``
    [R, Hkv, K], its first ``previous_len`` [R] positions real): where the cosine similarity over those
    positions exceeds ``threshold``, the previous ranking there, the new scores elsewhere."""
    width = scores.shape[-1]
    within = (torch.arange(width, device=scores.device) < previous_len[:, None])[:, None, :]
    s, p = scores * within, previous * within
    cosine = (s * p).sum(-1) / (s.norm(dim=-1) * p.norm(dim=-1)).clamp(min=1e-30)
    stays = (cosine > threshold) & (previous_len > 0)[:, None]
    return torch.where(stays[..., None] & within, previous, scores)


def kept_positions(
    ranking: torch.Tensor, always: torch.Tensor, k_valid: torch.Tensor, kept: torch.Tensor, most: int
) -> torch.Tensor:
    """ranking [R, Hg, K] of a group's heads, ``always`` [R, K] positions kept whatever their rank (the
    active block), ``kept`` [R] how many each row keeps (at most ``most``) -> [R, Hg, most]: each head's
    kept positions ascending, then ``K`` where the row keeps fewer. Ties go to the earlier position."""
    width = ranking.shape[-1]
    ranked = ranking.masked_fill(always[:, None], float("inf")).masked_fill(~k_valid[:, None], float("-inf"))
    top = torch.argsort(ranked, dim=-1, descending=True, stable=True)[..., :most]
    real = torch.arange(most, device=ranking.device) < kept[:, None]
    return torch.where(real[:, None], top, width).sort(-1).values
