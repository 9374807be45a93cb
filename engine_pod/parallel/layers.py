"""The layers a tensor-parallel model swaps in: each rank holds a slice of the weight and one collective
makes the layer's output whole (Megatron-LM's split: column-parallel in, row-parallel out).

- ``RowParallelLinear``: the input features split across ranks (the heads' outputs, the MLP's hidden
  units); each rank's partial product summed by one all-reduce.
- ``VocabParallelEmbedding``: each rank holds a run of the vocabulary's rows; a token outside it looks up
  zeros, and one all-reduce gives every rank every token's embedding.
- ``VocabParallelHead``: each rank's logits over its run of the vocabulary, gathered along the vocabulary
  (only for the positions the step selects: the LM head runs on nothing else).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine_pod.parallel.group import TensorParallel


class RowParallelLinear(nn.Linear):
    """A linear layer over this rank's slice of the input features; outputs summed over the ranks."""

    def __init__(self, in_features: int, out_features: int, parallel: TensorParallel) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.parallel = parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.parallel.all_reduce(super().forward(x))


class VocabParallelEmbedding(nn.Embedding):
    """Rows ``[start, start + rows)`` of the vocabulary's embedding (padding rows past its end)."""

    def __init__(self, rows: int, dim: int, start: int, parallel: TensorParallel) -> None:
        super().__init__(rows, dim)
        self.start, self.parallel = start, parallel

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.num_embeddings)
        out = F.embedding(local.clamp(0, self.num_embeddings - 1), self.weight)
        return self.parallel.all_reduce(out * inside[..., None].to(out.dtype))


class VocabParallelHead(nn.Linear):
    """The LM head's rows of this rank's run of the vocabulary; logits gathered to the whole vocabulary."""

    def __init__(self, dim: int, rows: int, vocab_size: int, parallel: TensorParallel) -> None:
        super().__init__(dim, rows, bias=False)
        self.vocab_size, self.parallel = vocab_size, parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.parallel.all_gather_last(super().forward(x))[..., : self.vocab_size]
