"""What rows of one batch hold in common when the runner shares whole blocks between them (no torch).

With a block prefix cache (block-diffusion models), rows whose tokens agree on their first whole blocks
hold one page for each of those blocks, not one each. A block is known by a key that chains its tokens
to the keys of the blocks before it, so two rows' blocks share a key only when everything up to their end
agrees. Admission counts a row's blocks whose keys the batch holds already as free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_pod.scheduler.request import Request


def block_keys(request: Request, block_length: int) -> list[int]:
    """Keys of ``request``'s whole blocks before its next active block (extended as it commits blocks)."""
    keys = request.block_keys
    tokens = request.prompt_ids + tuple(request.generated)
    whole = (request.prompt_len - request.grid_head) // block_length + request.blocks_done(block_length)
    _extend_keys(keys, tokens, whole, block_length)
    return keys[:whole]


def _extend_keys(keys: list[int], tokens, whole: int, block_length: int) -> None:
    for b in range(len(keys), whole):
        keys.append(hash((keys[-1] if keys else 0, tuple(tokens[b * block_length : (b + 1) * block_length]))))


@dataclass
class PinnedBlocks:
    """Warm prefixes' whole blocks, which the runner's prefix cache holds for good: their keys, and the
    tokens they take out of the budget (each block once)."""

    keys: set[int] = field(default_factory=set)
    tokens: int = 0

    def add(self, prefix: list[int], block_length: int) -> int:
        """Pin ``prefix``'s whole blocks; returns the tokens of those not pinned before."""
        keys: list[int] = []
        _extend_keys(keys, prefix, len(prefix) // block_length, block_length)
        new = [key for key in keys if key not in self.keys]
        self.keys.update(new)
        self.tokens += len(new) * block_length
        return len(new) * block_length

    def note(self) -> str:
        """What a refusal adds when warm prefixes hold part of the budget."""
        return f" (warm prefixes hold {self.tokens} more)" if self.tokens else ""


def shared_tokens(keys: list[int], held: set[int], block_length: int) -> int:
    """Tokens of the blocks ``keys`` names that the batch holds already (``held``)."""
    return block_length * sum(1 for key in keys if key in held)
