"""A long row's dual-cache refresh split across cycles (no torch): LLaDA and Dream recompute a row's every
position at its block's first forward, so a cycle carrying a long prompt's row pays that whole forward and
every row beside it waits for it. Split, the refresh is computed a few of the model's layers per cycle
(``CycleRow.refresh_split``), each piece beside the decoding rows; the row commits nothing until its last
piece is in, then decodes its block in the next cycle over the cache its pieces computed (the same
computation spread over cycles: its tokens are those it gets computed whole).

A row is split when its refresh (its width with the active block) is wider than ``SPLIT_AFTER_CHUNKS``
chunks (``--prefill-chunk``), into as many pieces as it has chunks, at most one per layer, so that a piece
costs about what a chunk's refresh through every layer costs. A row of one or two chunks is not split:
every block of a split row takes its pieces' cycles and one more, and its pieces compute positions its
decoding forward computes again, for a stall too short to matter (at a 2,048-token budget, chunks of 256,
splitting the mixed workload's rows of 257 to 385 positions took its padding efficiency from 1.0 to 0.91,
the same tokens, and no throughput to show for it). Only a runner that can keep a refresh between
cycles splits (``Runner.refresh_layers``: its layers; 0: it cannot).
"""

from __future__ import annotations

SPLIT_AFTER_CHUNKS = 2  # a refresh wider than this many chunks is split


class SplitRefreshes:
    """How far each split row's refresh is, as this scheduler scheduled it (by request)."""

    def __init__(self, chunk: int, layers: int) -> None:
        self.chunk, self.layers = chunk, layers
        self.done: dict[str, tuple[int, int]] = {}  # request id -> (pieces computed, pieces)

    def pieces(self, width: int) -> int:
        """Pieces a refresh of ``width`` positions is split into (0: computed whole)."""
        if not self.chunk or self.layers < 2 or width <= SPLIT_AFTER_CHUNKS * self.chunk:
            return 0
        return min(self.layers, -(-width // self.chunk))

    def split_of(self, request_id: str, width: int) -> tuple[int, int]:
        """The next row's ``CycleRow.refresh_split`` for a request whose refresh is ``width`` positions."""
        if request_id in self.done:
            return self.done[request_id]
        return (0, self.pieces(width))

    def ran(self, request_id: str, split: tuple[int, int], committed: bool) -> None:
        """A cycle ran the request's row with ``split``; ``committed``: its block was committed (else it
        goes on: a piece, or a block carried into the next cycle)."""
        done, pieces = split
        if not pieces:
            return
        if done < pieces:
            self.done[request_id] = (done + 1, pieces)
        elif committed:
            self.done.pop(request_id, None)  # the next block's refresh is split afresh

    def forget(self, request_id: str) -> None:
        """The runner let go of the request's refresh (finished, withdrawn, preempted): start again."""
        self.done.pop(request_id, None)
