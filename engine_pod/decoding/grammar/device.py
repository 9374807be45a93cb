"""The constrained rows' part of a denoising step on the device.

The host sends, with the step's inputs, each constrained row's grammar bitmask at its frontier and where
that frontier is (``GrammarStep``). The frontier's proposal is recomputed from its logits with the mask
applied (the argmax, or a sampled row's Gumbel-max draw, of the allowed tokens only); the row commits its
frontier alone on the device; the step's proposals and whether each was confident come back with the next
step's one read (``report``), for the host's commit rule (commit_rule.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.decoding.candidates import score_candidates
from engine_pod.decoding.scoring import max_probability

BITS = 32  # vocabulary entries per word of a bitmask


def allowed_tokens(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, vocab] bool from bitmasks [n, ceil(vocab / 32)] of int32 words (bit b of word w: token 32w + b)."""
    shifts = torch.arange(BITS, device=words.device, dtype=torch.int32)
    bits = (words[:, :, None] >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab].bool()


class MaskedLogits:
    """Selected positions' logits (a SelectedHidden) with each position's disallowed tokens at -inf."""

    restricts = False

    def __init__(self, selected, words: torch.Tensor, vocab: int) -> None:
        self.selected, self.words, self.vocab = selected, words, vocab

    def map_logits(self, fn, tokens: tuple[int, ...] = (), never: int | None = None):
        offset = 0

        def masked(chunk: torch.Tensor):
            nonlocal offset
            allowed = allowed_tokens(self.words[offset : offset + chunk.shape[0]], self.vocab)
            offset += chunk.shape[0]
            return fn(chunk.masked_fill(~allowed, float("-inf")))

        return self.selected.map_logits(masked, tokens, never)


@dataclass
class GrammarStep:
    """One step's constrained rows among the step's rows (c of them, the host's count)."""

    places: torch.Tensor  # [c] each one's row among the step's rows
    frontier: torch.Tensor  # [c] its frontier's position in its block
    first_candidate: torch.Tensor  # [c] the frontier's index among the step's candidates
    words: torch.Tensor  # [c, words] int32: the tokens its grammar allows at the frontier
    threshold: torch.Tensor  # [c] the confidence a proposal after the frontier needs
    vocab: int
    count: int

    def frontier_proposals(self, logits, sampling, owners, positions, step, score_dtype) -> torch.Tensor:
        """[c] each frontier's token under its mask: the masked argmax, or a sampled row's masked draw
        (the draw's noise is the unmasked draw's: seeded by the row, its position and the step)."""
        selected = MaskedLogits(logits.rows(self.first_candidate), self.words, self.vocab)
        index = self.first_candidate
        step_of = step[index] if isinstance(step, torch.Tensor) else step
        proposal, _ = score_candidates(
            selected, max_probability, sampling, owners[index], positions[index], step_of, score_dtype
        )
        return proposal

    def restrict(self, transfer: torch.Tensor) -> torch.Tensor:
        """``transfer`` [R', L] with each constrained row committing its frontier alone."""
        transfer = transfer.clone()
        transfer[self.places] = False
        transfer[self.places, self.frontier] = True
        return transfer

    def report(self, proposals: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
        """[c, 2L] int64 for the next read: each constrained row's proposals (its frontier's committed
        token) and whether each proposal was confident."""
        confident = confidence[self.places] >= self.threshold[:, None].to(confidence.dtype)
        return torch.cat([proposals[self.places], confident.long()], dim=1)
