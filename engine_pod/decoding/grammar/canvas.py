"""The commit rule on DiffusionGemma's uniform-noise canvases (decoding/entropy_bound.py).

Nothing on such a canvas is ever masked: every step draws every position again, and a row commits its
last step's argmax canvas when it stops. A constrained row instead freezes its canvas from the left: the
positions before its frontier hold its committed tokens in every step's input (they are never renoised);
at each step the frontier takes the argmax of the step's processed logits among the tokens its grammar
allows there, and the host walks on (commit_rule.py) over the positions the sampler accepted this step
(its entropy bound: the sampler's own confidence), committing each argmax token the grammar accepts, and
the tokens the grammar forces. The row stops when its canvas is committed whole, whatever the sampler's
adaptive stopping says, however many steps that takes (at least one token a step); its committed canvas
is the host's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.decoding.grammar.device import allowed_tokens
from engine_pod.decoding.grammar.rows import ConstrainedRows


@dataclass
class CanvasGrammarStep:
    """One step's constrained running rows (c of them), on the device."""

    places: torch.Tensor  # [c] their places among the running rows
    blocks: torch.Tensor  # [c, L] their committed tokens (-1 where not committed)
    frontier: torch.Tensor  # [c]
    words: torch.Tensor  # [c, words] int32: the tokens each grammar allows at the frontier
    complete: torch.Tensor  # [c] bool: the host committed the whole canvas (the row stops now)
    vocab: int
    count: int

    def freeze(self, canvas: torch.Tensor) -> torch.Tensor:
        """The running rows' step input [R, L] with the committed tokens in place."""
        if not self.count:
            return canvas
        frozen = torch.where(self.blocks >= 0, self.blocks, canvas[self.places])
        return canvas.index_copy(0, self.places, frozen)

    def on_step(
        self, processed: torch.Tensor, accepted: torch.Tensor, done: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' done flags with a constrained row's the host's, and the columns [R, 1 + L] the step's
        read brings back: a constrained row's frontier token under its mask, then which positions the
        sampler accepted (zeros for the other rows)."""
        rows, length = done.shape[0], processed.shape[1]
        extra = torch.zeros(rows, 1 + length, dtype=torch.int64, device=done.device)
        if not self.count:
            return done, extra
        logits = processed[self.places, self.frontier]
        allowed = allowed_tokens(self.words, self.vocab)
        token = logits.masked_fill(~allowed, float("-inf")).argmax(dim=-1)
        extra[self.places] = torch.cat([token[:, None], accepted[self.places].long()], dim=1)
        done = done.index_copy(0, self.places, self.complete)
        return done, extra


def send_canvas_grammar(grammar: ConstrainedRows, running: list[int]) -> CanvasGrammarStep:
    """The step's one grammar copy for the running rows (cycle rows, in running order)."""
    places = [place for place, row in enumerate(running) if row in grammar.rows]
    members = [running[place] for place in places]
    sent, masks = grammar.send_blocks(members, places)
    return CanvasGrammarStep(
        places=sent["places"],
        blocks=sent["blocks"],
        frontier=sent["frontier"],
        words=masks,
        complete=sent["complete"].bool(),
        vocab=grammar.compiler.vocab_size,
        count=len(members),
    )
