"""One categorical draw per position from each row's own CPU generator, batched over rows, bit for bit
what ``torch.multinomial(probabilities[r], 1, generator=generators[r])`` draws row by row.

torch's multinomial with one sample is the exponential race: ``q = empty_like(p).exponential_(gen)``,
then ``argmax(p / q)`` over the vocabulary. On a CPU, ``exponential_`` fills ``q`` one element at a time,
in memory order, with ``float(-log1p(-u))`` where ``u`` is the generator's double uniform (53 random bits
of one 64-bit draw), and calls the C library's ``log1p`` per element: about a microsecond per 30 elements,
the sampler's largest cost (a canvas of 32 positions over a vocabulary of 1,024 is 32,768 of them).

Here each row's ``u`` comes from its generator in one ``uniform_`` of doubles (the same 64-bit draws in
the same order, leaving the generator in the same state), and ``-log(1 - u)`` is computed with torch's
vectorised ``log`` (``1 - u`` is exact: ``u`` is a multiple of 2**-53). That logarithm can differ from the C
library's ``log1p`` in the last bits of a double, which changes the float it rounds to only when the double
lies within a few of its last bits of a float's rounding midpoint; such elements (about one in a million)
are recomputed with the C library's ``log1p`` (``math.log1p``), so the floats are the serial kernel's
exactly. The division and the argmax are torch's own, as multinomial does them.

Probabilities other than float32 (whose exponentials are doubles) and generators on another device
(a GPU's, whose exponentials are computed otherwise) draw with ``torch.multinomial`` row by row.
"""

from __future__ import annotations

import math

import torch

MANTISSA_CUT = (1 << 29) - 1  # a double's mantissa bits below float32's
MIDPOINT = 1 << 28  # those bits at a float32 rounding midpoint
NEAR_MIDPOINT = 1 << 8  # doubles this many last-bit units from a midpoint are recomputed exactly


def categorical_draws(probabilities: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """[R, L] int64: row r's token per position, drawn from ``probabilities[r]`` [L, V] (float32, each
    position's distribution) with ``generators[r]`` as ``torch.multinomial(..., 1)`` draws it."""
    rows, length, vocab = probabilities.shape
    on_cpu = probabilities.device.type == "cpu" and all(g.device.type == "cpu" for g in generators)
    if not on_cpu or probabilities.dtype != torch.float32:
        return torch.cat(
            [
                torch.multinomial(probabilities[r], num_samples=1, generator=g).view(1, length)
                for r, g in enumerate(generators)
            ]
        )
    _check(probabilities)
    waits = torch.empty(rows, length, vocab, dtype=torch.float32)
    scratch = ExponentialScratch(length * vocab)
    for row, generator in enumerate(generators):
        scratch.draw(generator, waits[row].view(-1))
    return probabilities.div(waits).argmax(dim=-1)


class ExponentialScratch:
    """One row's buffers, reused row after row (a row's doubles stay in the processor's cache)."""

    def __init__(self, size: int) -> None:
        self.uniforms = torch.empty(size, dtype=torch.float64)
        self.doubles = torch.empty(size, dtype=torch.float64)
        self.low_bits = torch.empty(size, dtype=torch.int64)

    def draw(self, generator: torch.Generator, out: torch.Tensor) -> None:
        """``out`` (float32) = what ``out.exponential_(generator=generator)`` gives, the same draws."""
        uniforms, doubles = self.uniforms.uniform_(generator=generator), self.doubles
        doubles.copy_(uniforms).neg_().add_(1.0)  # 1 - u is exact: u is a multiple of 2**-53 below 1
        doubles.log_().neg_()
        torch.bitwise_and(doubles.view(torch.int64), MANTISSA_CUT, out=self.low_bits)
        closeness = self.low_bits.sub_(MIDPOINT).abs_().neg_()  # max, not amin: amin is 10x slower
        if int(closeness.max()) > -NEAR_MIDPOINT:
            at = (closeness > -NEAR_MIDPOINT).nonzero(as_tuple=True)
            exact = [-math.log1p(-u) for u in uniforms[at].tolist()]
            doubles[at] = torch.tensor(exact, dtype=torch.float64)
        out.copy_(doubles)


def _check(probabilities: torch.Tensor) -> None:
    """torch.multinomial's refusal of a distribution it cannot draw from."""
    if not bool(((probabilities.amax() < math.inf) & (probabilities.amin() >= 0)).item()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
