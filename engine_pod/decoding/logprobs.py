"""Log probabilities of committed tokens, for the rows that asked: the LM head applied again to those
positions only, under the distribution each token was chosen from (tempered and truncated for a sampled
row, as decoding/sampling.py draws; the model's own for a greedy one)."""

from __future__ import annotations

import torch

from engine_pod.decoding.sampling import distribution_logits

TokenLogprob = tuple[float, list[tuple[int, float]]]  # (log p of the token, [(alternative id, log p), ...])


def asked_and_committed(
    candidate_rows: torch.Tensor, committed: torch.Tensor, counts: list[int | None]
) -> torch.Tensor:
    """Indices of the candidates that were committed and whose row asked for log probabilities."""
    asked = torch.tensor([k is not None for k in counts], device=candidate_rows.device)
    return (committed & asked[candidate_rows]).nonzero(as_tuple=True)[0]


def committed_logprobs(
    hidden,
    chosen: torch.Tensor,
    tokens: torch.Tensor,
    owners: torch.Tensor,
    counts: list[int | None],
    sampling,
    score_dtype: torch.dtype,
) -> list[TokenLogprob]:
    """For each ``chosen`` candidate (an index into ``hidden``, a SelectedHidden) committed as ``tokens``
    by row ``owners``: its log probability and its row's ``counts[row]`` most likely alternatives."""
    scores = hidden.lm_head(hidden.hidden[chosen]).to(score_dtype)
    if sampling is not None and bool(sampling.sampled[owners].any()):
        drawn = sampling.sampled[owners]
        picked = owners[drawn]
        scores[drawn] = distribution_logits(
            scores[drawn], sampling.temperature[picked], sampling.top_k[picked], sampling.top_p[picked]
        )
    log_p = torch.log_softmax(scores, dim=-1)
    own = log_p.gather(1, tokens[:, None])[:, 0].tolist()
    rows = owners.tolist()
    widest = max(counts[r] for r in rows)
    values, ids = log_p.topk(min(widest, log_p.shape[-1]), dim=-1)
    return [
        (own[i], list(zip(ids[i, : counts[r]].tolist(), values[i, : counts[r]].tolist())))
        for i, r in enumerate(rows)
    ]
