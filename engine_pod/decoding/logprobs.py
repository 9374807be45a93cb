"""Log probabilities of committed tokens, for the rows that asked, under the distribution each token was
chosen from (tempered and truncated for a sampled row, as decoding/sampling.py draws; the model's own for a
greedy one). They are computed in the candidates' scoring pass (decoding/candidates.py: the LM head runs
once) and wait on the device: ``LogprobRecorder.finish`` reads a whole cycle's at its end, in one read."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

TokenLogprob = tuple[float, list[tuple[int, float]]]  # (log p of the token, [(alternative id, log p), ...])


def token_logprobs(
    distribution: torch.Tensor, tokens: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of ``distribution`` [n, V] (logits): the log probability of its token, and of its ``width``
    likeliest tokens with their ids."""
    log_p = torch.log_softmax(distribution, dim=-1)
    values, ids = log_p.topk(min(width, log_p.shape[-1]), dim=-1)
    return log_p.gather(1, tokens[:, None])[:, 0], values, ids


@dataclass
class LogprobRecorder:
    """A cycle's asks for log probabilities (per batch row, alternatives asked; None: none) and what it
    records: each step's candidates' values stay on the device until ``finish``."""

    counts: list[int | None]
    values: list[list[TokenLogprob | None] | None]  # per batch row asking, per block position
    pending: list[torch.Tensor] = field(default_factory=list)

    @property
    def width(self) -> int:
        """The most alternatives a row asked for (every candidate's are computed to that width)."""
        return max(k for k in self.counts if k is not None)

    def keep(
        self,
        owners: torch.Tensor,
        positions: torch.Tensor,
        committed: torch.Tensor,
        scored: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> None:
        """One step's candidates (their batch rows, block positions, whether committed) and their log
        probabilities, as float64 columns (ids and positions are exact in a double)."""
        own, values, ids = scored
        columns = [owners[:, None], positions[:, None], committed[:, None], own[:, None], values, ids]
        self.pending.append(torch.cat([c.to(torch.float64) for c in columns], dim=1))

    def finish(self) -> None:
        """The cycle's one read of what it kept: each committed token's value, for the rows that asked."""
        if not self.pending:
            return
        width = self.width
        for row in torch.cat(self.pending).tolist():
            owner, position, committed, own = int(row[0]), int(row[1]), row[2], row[3]
            asked = self.counts[owner]
            if not committed or asked is None:
                continue
            values, ids = row[4 : 4 + width], row[4 + width :]
            alternatives = [(int(i), v) for i, v in zip(ids[:asked], values[:asked])]
            self.values[owner][position] = (own, alternatives)
        self.pending.clear()
