"""The bidirectional transformer both LLaDA and Dream are built from.

Two entry points, both taking explicit position ids:
- ``forward_full``: the whole canvas with a key-padding mask; optionally fills a KV cache.
- ``forward_window``: a window of each row's canvas (the active block, or the block and its suffix)
  whose fresh K/V are written into the cache at that row's own slots before attending over it.
The LM head runs only on the (row, token) pairs the caller asks for, never on the whole sequence.
"""

from __future__ import annotations

import torch
from torch import nn

from engine_pod.models.config import ModelConfig
from engine_pod.models.kv_cache import KVCache
from engine_pod.models.layers import AttentionContext, DecoderBlock, RMSNorm, RotaryEmbedding
from engine_pod.models.packed import PackedContext, PackedKVCache


class SelectedHidden:
    """Final hidden states of selected positions; the LM head is applied in chunks by ``map_logits``.

    Chunking bounds the logits' memory (rows x block x vocabulary would dominate with 126k-152k
    vocabularies) by a constant, so peak memory stays linear in the tokens of the batch.
    """

    LOGITS_PER_CHUNK = 1 << 24  # vocabulary entries per chunk (64 MB in float32)
    MAX_ROWS_PER_CHUNK = 1024  # small vocabularies: still a bounded number of positions per chunk

    def __init__(self, hidden: torch.Tensor, lm_head: nn.Linear) -> None:
        self.hidden = hidden
        self.lm_head = lm_head
        self.chunk = max(16, min(self.MAX_ROWS_PER_CHUNK, self.LOGITS_PER_CHUNK // lm_head.out_features))

    def map_logits(self, fn):
        """Apply ``fn(logits) -> tuple of [n] tensors`` chunk by chunk and concatenate the results."""
        if self.hidden.shape[0] == 0:
            return fn(self.lm_head(self.hidden))
        parts = [fn(self.lm_head(piece)) for piece in self.hidden.split(self.chunk)]
        return tuple(torch.cat(items) for items in zip(*parts))

    def logits(self) -> torch.Tensor:
        return self.lm_head(self.hidden)


class DiffusionTransformer(nn.Module):
    """Embedding, pre-norm decoder blocks without a causal mask, final norm, untied LM head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderBlock(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)

    def fuse_projections(self) -> None:
        """Inference: each layer's q, k and v projections as one matmul (see ``Attention.fuse_projections``)."""
        for layer in self.layers:
            layer.attn.fuse_projections()

    def new_cache(self) -> KVCache:
        return KVCache(self.config.num_layers)

    def _run_layers(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        ctx: AttentionContext | PackedContext,
        final_queries: torch.Tensor | None = None,
    ):
        """Hidden states after the last layer: of every position, or of ``final_queries`` only (the last
        layer then computes queries, attention output and MLP for those positions alone)."""
        hidden = self.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(position_ids, hidden.dtype)
        for layer in self.layers[:-1]:
            hidden = layer(hidden, cos, sin, ctx)
        return self.layers[-1](hidden, cos, sin, ctx, final_queries)

    def _logits(self, hidden: torch.Tensor, select: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        if select is None:
            return self.lm_head(self.norm(hidden))
        return SelectedHidden(self.norm(hidden[select[0], select[1]]), self.lm_head)

    def forward_full(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        key_mask: torch.Tensor,
        cache: KVCache | None = None,
        select: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | SelectedHidden:
        """Logits of every token ([R, T, V]), or the selected (row, token) pairs' hidden states."""
        if cache is not None:
            cache.set_key_mask(key_mask)
        # always the mask, all True or not: deciding would read the device, and the ops stay the same
        hidden = self._run_layers(input_ids, position_ids, AttentionContext(key_mask, cache))
        return self._logits(hidden, select)

    def forward_window(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache: KVCache,
        rows: torch.Tensor | None,
        slots: torch.Tensor,
        select: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | SelectedHidden:
        """Logits (or selected hidden states) for a window [R', W] of cache rows ``rows`` (None: all) placed at cache ``slots``."""
        ctx = AttentionContext(None, cache, rows, slots)
        hidden = self._run_layers(input_ids, position_ids, ctx)
        return self._logits(hidden, select)

    def forward_packed(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, ctx: PackedContext, select: torch.Tensor
    ) -> SelectedHidden:
        """Selected positions' hidden states of a packed batch: ``input_ids``/``position_ids`` [N], the
        rows one after another (see models/packed.py); ``select`` [n] packed positions, grouped by row in
        row order (the context's final plan has their spans)."""
        hidden = self._run_layers(input_ids[None], position_ids[None], ctx, select)
        return SelectedHidden(self.norm(hidden[0]), self.lm_head)

    def new_packed_cache(self) -> PackedKVCache:
        return PackedKVCache(self.config.num_layers)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Plain batch-1-style forward over unpadded rows: logits for every token."""
        rows, tokens = input_ids.shape
        positions = torch.arange(tokens, device=input_ids.device).expand(rows, tokens)
        key_mask = torch.ones(rows, tokens, dtype=torch.bool, device=input_ids.device)
        return self.forward_full(input_ids, positions, key_mask)
