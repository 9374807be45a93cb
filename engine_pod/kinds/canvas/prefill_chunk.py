"""A chunk row of a canvas cycle (scheduler/prefill_chunks.py decides them): DiffusionGemma's context
encoder writes a long prompt's keys and values up to ``CycleRow.prefill_to`` in the cycle's one encoder
forward, packed beside the other rows' new context (the canvases they committed last cycle), and the row
draws no canvas and commits nothing.

The encoder is causal (a sliding layer within its window) and the decoder reads only the keys and values
it wrote, never its hidden states: a chunk's queries attend to the keys and values of the chunks before it
(the row's kept context, read from the pool) and causally to their own, so the cache holds the same
positions' keys and values whether the prompt is encoded whole or a chunk at a time (up to rounding, which
float64 leaves below any decision). The row's last chunk (at most one chunk's tokens) goes with its
first canvas's cycle, as an unchunked prompt's whole context does: its canvas starts when its context is in
the cache.

While chunks run beside decoding rows, the decoding rows wait on them: ``chunk_wait_s`` is the time from
the encoder forward's start to the first denoising step's read (what the device ran for both, on a GPU as
on a CPU), times the chunks' share of the tokens those two forwards computed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine_pod.runner.contract import CycleStats
from engine_pod.scheduler.cycle_row import CycleRow


@dataclass
class CanvasChunks:
    """A cycle's chunk rows and the timing of the forwards the decoding rows share with them."""

    rows: set[int] = field(default_factory=set)  # the rows (their places in the cycle) that encode a chunk
    timing: tuple[float, float] | None = None  # (the encoder forward's start, the chunks' share of tokens)

    @classmethod
    def of(cls, rows: list[CycleRow], computed: list[int]) -> CanvasChunks:
        return cls({i for i in computed if rows[i].prefill_to})

    @staticmethod
    def end(row: CycleRow) -> int:
        """How much of the row's prefix its context holds after this cycle's encoder forward."""
        return row.prefill_to or len(row.prefix_ids)

    def count(self, tokens: int, encoded: int, decoded: int, stats: CycleStats) -> None:
        """Before the encoder forward: the chunks and their ``tokens`` (of ``encoded`` the forward computes);
        with ``decoded`` tokens of decoding rows beside them, when it began and the chunks' share."""
        if not self.rows:
            return
        stats.prefill_chunks, stats.prefill_chunk_tokens = len(self.rows), tokens
        if decoded:
            self.timing = (time.perf_counter(), tokens / max(encoded + decoded, 1))

    def first_step_read(self, stats: CycleStats) -> None:
        """After the first denoising step's read (it waited for the encoder forward): the decoding rows'
        wait on the chunks."""
        if self.timing is not None:
            began, share = self.timing
            stats.chunk_wait_s = (time.perf_counter() - began) * share
            self.timing = None
