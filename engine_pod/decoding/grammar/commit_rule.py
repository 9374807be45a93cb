"""The commit rule that keeps a constrained row's answer in its grammar (host side, no torch).

A constrained row commits its block left to right from its frontier (the first position of its block not
committed). Each step the device commits the frontier under the grammar's mask (the masked argmax, or a
sampled row's masked draw), so every step commits at least one token the grammar accepts; then the host
walks the positions after it and commits each whose proposal (the model's top token there, or its draw)
was confident and is accepted by the grammar after the tokens before it, stopping at the first that is not;
where the grammar allows one continuation alone (a JSON key, the punctuation between values: the
schema's scaffolding; the end of an answer that is whole), those tokens are committed whatever the model
proposed.
No token the grammar rejects is ever committed, and the end of the answer (an EOS id) only where the
grammar accepts the answer as complete; after it, the rest of the block is that EOS id. So every answer
that ends is in the grammar's language, and where the model is confident a step commits several tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GrammarRow:
    """One constrained row: its matcher (the grammar's state after every token of the answer committed so
    far) and its block as the host knows it (None: not committed)."""

    matcher: Any  # an llguidance LLMatcher
    block: list[int | None]
    eos_ids: tuple[int, ...]
    ended: bool = False  # the answer has ended (an EOS id committed)
    end_token: int | None = None  # the EOS id it ended with

    @classmethod
    def start(cls, matcher: Any, answer: list[int], block: list[int | None], eos_ids: tuple[int, ...]):
        """The row after ``answer`` (every token of its answer committed so far: in earlier blocks, and in
        this one before its frontier), with ``block`` its block as committed so far."""
        row = cls(matcher, list(block), tuple(eos_ids))
        row._consume(list(answer), "an earlier step")
        if row.ended:
            row._fill(row.frontier)
        return row

    @property
    def frontier(self) -> int:
        """The first position of the block not committed (the block's length when it is complete)."""
        return next((k for k, token in enumerate(self.block) if token is None), len(self.block))

    @property
    def complete(self) -> bool:
        return self.frontier == len(self.block)

    def commit(
        self, frontier_token: int, proposals: list[int], confident: list[bool]
    ) -> list[tuple[int, int]]:
        """The step's commits: ``frontier_token`` (the device's, under the mask) at the frontier, then the
        positions after it while their proposal is ``confident`` and accepted. Returns the positions the
        host commits beyond the frontier, with their tokens (the device holds the frontier's already)."""
        k = self.frontier
        if k == len(self.block):
            return []
        self._consume([frontier_token], f"position {k} (its mask allowed it)")
        self.block[k] = frontier_token
        if self.ended:
            return self._fill(k + 1)
        commits, j = [], k + 1
        while j < len(self.block):
            if self.matcher.is_stopped():  # the answer is whole: its end alone may follow
                self._consume([self.eos_ids[0]], f"position {j} (the answer's end)")
                return commits + self._fill(j)
            forced = self.matcher.compute_ff_tokens()[: len(self.block) - j]
            if forced:  # the grammar allows these alone: committed whatever the model proposed
                self._consume(forced, f"position {j} (forced by the grammar)")
                commits += [(j + i, token) for i, token in enumerate(forced)]
                self.block[j : j + len(forced)] = forced
                j += len(forced)
                continue
            token = proposals[j]
            if not confident[j] or self.matcher.try_consume_tokens([token]) != 1:
                break
            self.block[j] = token
            commits.append((j, token))
            j += 1
            if token in self.eos_ids:
                self.ended, self.end_token = True, token
                return commits + self._fill(j)
        return commits

    def _consume(self, tokens: list[int], where: str) -> None:
        for token in tokens:
            if not self.matcher.consume_token(token):
                raise RuntimeError(f"the grammar refused token {token} at {where}; this is a bug")
            if token in self.eos_ids:
                self.ended, self.end_token = True, token
                return

    def _fill(self, start: int) -> list[tuple[int, int]]:
        """The rest of the block after the answer's end: its EOS id."""
        eos = self.eos_ids[0] if self.end_token is None else self.end_token
        filled = [(j, eos) for j in range(start, len(self.block)) if self.block[j] is None]
        for j, token in filled:
            self.block[j] = token
        return filled
