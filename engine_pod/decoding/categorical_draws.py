"""One categorical draw per position from each row's own generator, batched over rows, bit for bit
what ``torch.multinomial(probabilities[r], 1, generator=generators[r])`` draws row by row, without
reading the device: a step's draws are finished once the host has made its one read of the step.

torch's multinomial with one sample is the exponential race: ``q = empty_like(p).exponential_(gen)``,
then ``argmax(p / q)`` over the vocabulary, after checking on the host that ``p`` holds no inf, nan or
negative value (two device reads per call). Here each row's ``q`` is drawn from its generator as
multinomial draws it, the check is a device flag the caller reads with the rest of its step
(``PendingDraws.valid``), and the division and the argmax are torch's own, for every row at once.

On a CPU, ``exponential_`` fills ``q`` one element at a time, in memory order, with ``float(-log1p(-u))``
where ``u`` is the generator's double uniform (53 random bits of one 64-bit draw), and calls the C
library's ``log1p`` per element: about a microsecond per 30 elements, the sampler's largest cost (a
canvas of 32 positions over a vocabulary of 1,024 is 32,768 of them). So for float32 probabilities and
CPU generators each row's ``u`` comes from its generator in one ``uniform_`` of doubles (the same 64-bit
draws in the same order, leaving the generator in the same state), and ``-log(1 - u)`` is computed with
torch's vectorised ``log`` (``1 - u`` is exact: ``u`` is a multiple of 2**-53). That logarithm can differ
from the C library's ``log1p`` in the last bits of a double, which changes the float it rounds to only
when the double lies within a few of its last bits of a float's rounding midpoint. Such elements (about
one in a million) are found on the device: their positions and uniforms (up to ``suspects_kept`` per
row) join the step's one read (``PendingDraws.report``), and ``finish`` recomputes them with the C
library's ``log1p`` (``math.log1p``), so the floats are the serial kernel's exactly. A row with more than
that (never seen at these sizes) is drawn again with the serial kernel from its generator's state as it
was before the row's draw.
"""

from __future__ import annotations

import math
import struct

import torch

MANTISSA_CUT = (1 << 29) - 1  # a double's mantissa bits below float32's
MIDPOINT = 1 << 28  # those bits at a float32 rounding midpoint
NEAR_MIDPOINT = 1 << 8  # doubles this many last-bit units from a midpoint are recomputed exactly
SUSPECT_MARGIN = 8  # positions kept per row: this many times a row's expected count (at least 4)


def suspects_kept(elements: int) -> int:
    """How many near-midpoint positions a row of ``elements`` draws reports in the step's read."""
    expected = elements * 2 * NEAR_MIDPOINT / (1 << 29)
    return max(4, math.ceil(SUSPECT_MARGIN * expected))


class PendingDraws:
    """Every row's exponential waits drawn, but not yet the tokens: ``finish`` makes them from the host's
    read of ``report`` (a row's near-midpoint positions, its element count in the places beyond them,
    then their uniforms' bits; no columns where nothing needs recomputing) and of ``valid``."""

    def __init__(self, probabilities: torch.Tensor, generators: list[torch.Generator]) -> None:
        rows, length, vocab = probabilities.shape
        self.probabilities, self.generators = probabilities, generators
        self.valid = (probabilities.amax() < math.inf) & (probabilities.amin() >= 0)
        self.waits = torch.empty_like(probabilities)
        self.saved: list[torch.Tensor] = []  # each row's generator state before its draw (CPU path)
        fast = probabilities.dtype == torch.float32 and probabilities.device.type == "cpu"
        if not fast or any(g.device.type != "cpu" for g in generators):
            for row, generator in enumerate(generators):
                self.waits[row].exponential_(generator=generator)
            self.report = probabilities.new_empty(rows, 0, dtype=torch.int64)
            return
        kept = suspects_kept(length * vocab)
        self.report = torch.empty(rows, 2 * (kept + 1), dtype=torch.int64, device=probabilities.device)
        scratch = ExponentialScratch(length * vocab, probabilities.device)
        for row, generator in enumerate(generators):
            self.saved.append(generator.get_state())
            scratch.draw(generator, self.waits[row].view(-1), self.report[row])

    def finish(self, report: list[list[int]], valid: bool) -> torch.Tensor:
        """[R, L] int64 tokens, once the host has read ``report`` and ``valid``."""
        if not valid:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        for row, values in enumerate(report):
            if values:
                self._recompute(row, values)
        return self.probabilities.div(self.waits).argmax(dim=-1)

    def _recompute(self, row: int, values: list[int]) -> None:
        """The row's near-midpoint elements with the C library's log1p (its whole draw again, serially,
        where it has more of them than were reported)."""
        kept = len(values) // 2
        positions, bits = values[:kept], values[kept:]
        flat = self.waits[row].view(-1)
        if positions[-1] < flat.numel():
            again = torch.Generator().set_state(self.saved[row])
            flat.exponential_(generator=again)
            return
        for position, pattern in zip(positions, bits):
            if position == flat.numel():
                break
            uniform = struct.unpack("<d", struct.pack("<q", pattern))[0]
            flat[position].fill_(-math.log1p(-uniform))


def categorical_draws(probabilities: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """[R, L] int64: row r's token per position, drawn from ``probabilities[r]`` [L, V] (each position's
    distribution) with ``generators[r]`` as ``torch.multinomial(..., 1)`` draws it (reading the device
    at once: a caller with a read of its own makes ``PendingDraws`` and reads them with it)."""
    pending = PendingDraws(probabilities, generators)
    return pending.finish(pending.report.tolist(), bool(pending.valid))


class ExponentialScratch:
    """One row's buffers, reused row after row (a row's doubles stay in the processor's cache)."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.uniforms = torch.zeros(
            size + 1, dtype=torch.float64, device=device
        )  # the last: an unused place's
        self.doubles = torch.empty(size, dtype=torch.float64, device=device)
        self.low_bits = torch.empty(size, dtype=torch.int64, device=device)
        self.near = torch.empty(size, dtype=torch.bool, device=device)

    def draw(self, generator: torch.Generator, out: torch.Tensor, report: torch.Tensor) -> None:
        """``out`` (float32) = what ``out.exponential_(generator=generator)`` gives, the same draws, but for
        the elements near a float's rounding midpoint: their positions (up to half of ``report``, then
        ``out.numel()``; a position in its last place means there may be more) and their uniforms' bits
        go to ``report``."""
        size = self.doubles.numel()
        uniforms, doubles = self.uniforms[:size].uniform_(generator=generator), self.doubles
        doubles.copy_(uniforms).neg_().add_(1.0)  # 1 - u is exact: u is a multiple of 2**-53 below 1
        doubles.log_().neg_()
        # near: |low bits - midpoint| < NEAR_MIDPOINT, as one shift into [0, 2 NEAR_MIDPOINT - 1) modulo 2**29
        torch.add(doubles.view(torch.int64), NEAR_MIDPOINT - 1 - MIDPOINT, out=self.low_bits)
        torch.lt(self.low_bits.bitwise_and_(MANTISSA_CUT), 2 * NEAR_MIDPOINT - 1, out=self.near)
        positions, bits = report.view(2, -1)
        torch.nonzero_static(self.near, size=positions.numel(), fill_value=size, out=positions.view(-1, 1))
        torch.index_select(self.uniforms.view(torch.int64), 0, positions, out=bits)
        out.copy_(doubles)
