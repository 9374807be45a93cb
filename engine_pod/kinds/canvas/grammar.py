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


def send_canvas_grammar(grammar: ConstrainedRows | None, running: list[int]) -> CanvasGrammarStep | None:
    """The step's one grammar copy for the running rows (cycle rows, in running order); None: the cycle has
    no constrained row."""
    if grammar is None:
        return None
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


def walk(grammar: ConstrainedRows | None, running: list[int], result) -> None:
    """The host's commits of the constrained rows that stepped (commit_rule.py): each frontier's token as
    the device chose it, then the argmax tokens the sampler accepted, while the grammar accepts them.
    ``result``: the step's CanvasStepDecision, as read."""
    if grammar is None:
        return
    for place, row in enumerate(running):
        if row in grammar.rows and not result.done_rows[place]:
            extra = result.extra_rows[place]
            grammar.advance(row, extra[0], result.argmax_rows[place], [bool(flag) for flag in extra[1:]])


def committed(grammar: ConstrainedRows | None, row: int, canvas: list[int]) -> list[int]:
    """A stopped row's committed canvas: the step's argmax, or a constrained row's as the host has it."""
    return grammar.block(row) if grammar is not None and row in grammar.rows else canvas


def most_steps(limit: int, grammar: ConstrainedRows | None, length: int) -> int:
    """A cycle's most steps: a constrained row commits one token a step at least, then stops a step later."""
    return limit if grammar is None else max(limit, length + 2)


def add_cost(grammar: ConstrainedRows | None, stats) -> None:
    if grammar is not None:
        stats.add_grammar(grammar.cost)
