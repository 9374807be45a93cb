"""What every split of a transformer shares: each rank's query heads and K/V heads, its run of the
vocabulary, the check that the model divides, and the rank's part of a whole parameter as a ``Cut``
(``cut``; None where the rank holds none of it: another rank's experts)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.models.config import ModelConfig, ModelConfigError
from engine_pod.parallel.cuts import Cut
from engine_pod.parallel.group import TensorParallel


@dataclass(frozen=True)
class HeadSplit:
    """One rank's heads and vocabulary rows of a model of ``config`` (split over the group's tensor ranks:
    repeated whole where the group spreads only experts)."""

    config: ModelConfig
    parallel: TensorParallel

    def check(self, widths: list[int]) -> None:
        """Refuse, in one line, a group size that does not split the heads and these MLP ``widths``."""
        config, size = self.config, self.parallel.tensor_size
        kv = config.num_kv_heads
        if config.num_heads % size or (kv % size and size % kv) or any(w % size for w in widths):
            raise ModelConfigError(
                f"--tensor-parallel {size} does not divide the model: {config.num_heads} heads, {kv} KV "
                f"heads and MLP widths {widths} must each split evenly (or the KV heads divide the ranks)"
            )

    @property
    def heads(self) -> int:
        return self.config.num_heads // self.parallel.tensor_size

    @property
    def kv_heads(self) -> tuple[int, int]:
        """(first, count) of this rank's K/V heads: its share, or the one its query heads share."""
        kv, size, rank = self.config.num_kv_heads, self.parallel.tensor_size, self.parallel.tensor_rank
        return (rank * (kv // size), kv // size) if kv % size == 0 else (rank * kv // size, 1)

    @property
    def vocab_rows(self) -> int:
        """Rows of the vocabulary each rank holds (the last rank's run padded with zero rows)."""
        return -(-self.config.vocab_size // self.parallel.tensor_size)

    def vocab_cut(self, shape: tuple[int, ...]) -> Cut:
        """This rank's run of the rows of an embedding or an LM head (zero rows past the vocabulary)."""
        start = self.parallel.tensor_rank * self.vocab_rows
        return Cut.along(shape, 0, (start, start + self.vocab_rows))

    def split_cut(
        self, shape: tuple[int, ...], dim: int, rank: int | None = None, size: int | None = None
    ) -> Cut:
        """Part ``rank`` of ``size`` equal runs of dimension ``dim`` (default: this rank's tensor split)."""
        rank = self.parallel.tensor_rank if rank is None else rank
        size = self.parallel.tensor_size if size is None else size
        width = shape[dim] // size
        return Cut.along(shape, dim, (rank * width, (rank + 1) * width))

    def shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        """This rank's part of the whole model's parameter ``name`` as a tensor of its own (None: none)."""
        cut = self.cut(name, tuple(tensor.shape))
        return None if cut is None else cut.apply(tensor)

    def cut(self, name: str, shape: tuple[int, ...]) -> Cut | None:
        raise NotImplementedError
