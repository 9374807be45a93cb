"""What every split of a transformer shares: each rank's query heads and K/V heads, its run of the
vocabulary, and the check that the model divides."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.models.config import ModelConfig, ModelConfigError
from engine_pod.parallel.group import TensorParallel


@dataclass(frozen=True)
class HeadSplit:
    """One rank's heads and vocabulary rows of a model of ``config``."""

    config: ModelConfig
    parallel: TensorParallel

    def check(self, widths: list[int]) -> None:
        """Refuse, in one line, a group size that does not split the heads and these MLP ``widths``."""
        config, size = self.config, self.parallel.size
        kv = config.num_kv_heads
        if config.num_heads % size or (kv % size and size % kv) or any(w % size for w in widths):
            raise ModelConfigError(
                f"--tensor-parallel {size} does not divide the model: {config.num_heads} heads, {kv} KV "
                f"heads and MLP widths {widths} must each split evenly (or the KV heads divide the ranks)"
            )

    @property
    def heads(self) -> int:
        return self.config.num_heads // self.parallel.size

    @property
    def kv_heads(self) -> tuple[int, int]:
        """(first, count) of this rank's K/V heads: its share, or the one its query heads share."""
        kv, size, rank = self.config.num_kv_heads, self.parallel.size, self.parallel.rank
        return (rank * (kv // size), kv // size) if kv % size == 0 else (rank * kv // size, 1)

    @property
    def vocab_rows(self) -> int:
        """Rows of the vocabulary each rank holds (the last rank's run padded with zero rows)."""
        return -(-self.config.vocab_size // self.parallel.size)

    def vocab_slice(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's run of the rows of an embedding or an LM head (a copy, zero-padded)."""
        rows, start = self.vocab_rows, self.parallel.rank * self.vocab_rows
        out = tensor.new_zeros(rows, *tensor.shape[1:])
        piece = tensor[start : start + rows]
        out[: piece.shape[0]] = piece
        return out
