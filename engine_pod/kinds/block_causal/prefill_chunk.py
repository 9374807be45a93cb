"""A chunk row of a block cycle (scheduler/prefill_chunks.py decides them): a prompt's keys and values
computed up to ``BlockRow.chunk_end`` in the cycle's first forward, beside the decoding rows' blocks.

The chunk's last block stands in for the row's active block (its tokens are the prompt's: it has no
masks), so the forward's builders (batches.py) lay the chunk out as any row whose queries reach back
before its block: queries ``[cached, chunk_end)``, keys ``[0, chunk_end)``, block-causal. The keys and
values are final, as an unchunked prompt's are (a block attends its own and earlier blocks only), so a
row's blocks are the same tokens chunked or not. The row takes part in that forward only: with no masks it
leaves the next ones, and commits nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine_pod.kinds.block_causal.cycle_layout import BlockRow, live_rows
from engine_pod.runner.contract import CycleStats


@dataclass
class CycleChunks:
    """A cycle's chunk rows with keys and values to compute (a prefix cache may have held a chunk already),
    and the timing of the first forward they share with decoding rows."""

    rows: list[int] = field(default_factory=list)
    timing: tuple[float, float] | None = None  # (the first forward's start, the chunks' share of its tokens)

    @classmethod
    def of(cls, rows: list[BlockRow]) -> CycleChunks:
        return cls([i for i, row in enumerate(rows) if row.chunk_end and row.cached < row.chunk_end])

    def going_on(self, step: int, stats: CycleStats) -> bool:
        """At the step after the first (its read waited for the first forward): the decoding rows' wait on
        the chunks; whether a chunk still needs the first step."""
        if step == 1 and self.timing is not None:
            began, share = self.timing
            stats.chunk_wait_s = (time.perf_counter() - began) * share
        return step == 0 and bool(self.rows)

    def live(self, step: int, masked: torch.Tensor, counts: list[int], gather: bool):
        """The rows of a step, on the host and on the device: at the first, those with masks and the chunks
        with work (every row, the common case, without a copy); after it, as live_rows says."""
        if step or not self.rows:
            return live_rows(masked, counts, gather)
        wanted = set(self.rows)
        live = [i for i, count in enumerate(counts) if count or i in wanted]
        if len(live) == len(counts):
            return live, torch.arange(len(counts), device=masked.device)
        return live, torch.tensor(live, device=masked.device)

    def count(self, step: int, rows: list[BlockRow], tokens: int, decoding: bool, stats: CycleStats) -> None:
        """At the first step: the chunks and their tokens; with decoding rows beside them, when the forward
        began and the chunks' share of its ``tokens``."""
        if step or not self.rows:
            return
        stats.prefill_chunks = len(self.rows)
        stats.prefill_chunk_tokens = sum(rows[i].chunk_end - rows[i].cached for i in self.rows)
        if decoding:
            self.timing = (time.perf_counter(), stats.prefill_chunk_tokens / max(tokens, 1))


def after_forward(row: BlockRow, start: int) -> int:
    """What a row's cache holds after a forward: a chunk row's whole chunk (its stand-in block is the
    prompt's, final), another row's tokens before its active block."""
    return row.chunk_end if row.chunk_end else start


def keep_blocks(rows: list[BlockRow], starts: list[int], blocks: list[list[int]]) -> None:
    """Each row's tokens extended by its block (a chunk row's stand-in block is its prompt's: kept as is)."""
    for row, start, block in zip(rows, starts, blocks):
        if not row.chunk_end:
            row.tokens[start:] = block


def committed(rows: list[BlockRow], values: list, heads: list[int]) -> list:
    """Per row, what its block commits (``values``: its block's tokens or log probabilities, from its fixed
    head on); None for a chunk row, which commits nothing."""
    return [None if row.chunk_end or v is None else v[h:] for row, v, h in zip(rows, values, heads)]
