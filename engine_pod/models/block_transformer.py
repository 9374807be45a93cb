"""The block-diffusion transformer (LLaDA2.0): causal across blocks, bidirectional inside a block.

Module names are the checkpoint's own (``model.`` dropped), so a Hugging Face state dict loads as is:
``word_embeddings``, ``layers.N.{input_layernorm, attention.{query_key_value, query_layernorm,
key_layernorm, dense}, post_attention_layernorm, mlp}``, ``norm``, ``lm_head``. The first
``first_k_dense_replace`` layers have a dense gated MLP, the others a mixture of experts.

Every forward reads and writes a paged KV pool (models/paged_kv.py): the queries' keys and values are
written at their slots first, then each row attends over its key slots under a block-causal mask, in
the forward's layout (models/forward_batch.py, built by kinds/block_causal/batches.py: a padded box or packed rows). A row's queries are its
not-yet-cached committed tokens (stored for good) and its active block.
"""

from __future__ import annotations

import torch
from torch import nn

from engine_pod.models.config import ModelConfig
from engine_pod.models.forward_batch import ForwardBatch
from engine_pod.models.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rotary
from engine_pod.models.logit_budget import LogitBudget
from engine_pod.models.moe import MixtureOfExperts
from engine_pod.models.paged_kv import PagedKVPool, model_pool
from engine_pod.models.transformer import SelectedHidden


class BlockAttention(nn.Module):
    """Fused q/k/v projection, optional per-head q/k RMSNorm, RoPE on the first ``rotary_dim`` dims."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hd, heads, kv = config.head_dim, config.num_heads, config.num_kv_heads
        self.heads, self.kv_heads, self.head_dim = heads, kv, hd
        self.rotary_dim = config.rotary_dim or hd
        width = (heads + 2 * kv) * hd
        self.query_key_value = nn.Linear(config.hidden_size, width, bias=config.qkv_bias)
        if config.qk_norm:
            self.query_layernorm = RMSNorm(hd, config.rms_norm_eps)
            self.key_layernorm = RMSNorm(hd, config.rms_norm_eps)
        self.dense = nn.Linear(heads * hd, config.hidden_size, bias=config.output_bias)
        self.qk_norm = config.qk_norm

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[R, T, heads, hd] -> [R, heads, T, hd] with RoPE on the first rotary_dim dimensions."""
        x = x.transpose(1, 2)
        rotated = apply_rotary(x[..., : self.rotary_dim], cos, sin)
        if self.rotary_dim == self.head_dim:
            return rotated
        return torch.cat([rotated, x[..., self.rotary_dim :].to(rotated.dtype)], dim=-1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch, layer: int):
        rows, queries, _ = x.shape
        qkv = self.query_key_value(x).view(rows, queries, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        if self.qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        return self.dense(batch.attend(layer, q, k.transpose(1, 2), v).reshape(rows, queries, -1))


class BlockDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = BlockAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        dense = config.moe is None or index < config.moe.first_dense_layers
        self.mlp = GatedMLP(config) if dense else MixtureOfExperts(config)
        self.index = index

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        x = x + self.attention(self.input_layernorm(x), cos, sin, batch, self.index)
        return x + self.mlp(self.post_attention_layernorm(x))


class BlockDiffusionTransformer(nn.Module):
    """Embedding, pre-norm decoder layers, final norm, untied LM head (applied to selected positions)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(BlockDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.rotary_dim or config.head_dim, config.rope_theta)
        self.logit_budget = LogitBudget()  # the runner's (CycleRunner sets it from its DecodingConfig)

    def fuse_projections(self) -> None:
        """Inference layout: q, k and v are one projection in the checkpoint already; each MoE layer's
        experts are stacked for grouped matmuls (``MixtureOfExperts.stack_experts``)."""
        for module in self.modules():
            if isinstance(module, MixtureOfExperts):
                module.stack_experts()

    def new_pool(self, num_pages: int, page_size: int, device: torch.device) -> PagedKVPool:
        return model_pool(self.config, num_pages, page_size, self.lm_head.weight.dtype, device)

    def forward_batch(self, batch: ForwardBatch, select: tuple[torch.Tensor, torch.Tensor]) -> SelectedHidden:
        """Hidden states of the selected (row, query) pairs, after writing every query's K/V to the pool."""
        hidden = self.word_embeddings(batch.tokens)
        cos, sin = self.rotary.cos_sin(batch.positions, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, batch)
        return SelectedHidden(self.norm(hidden[select[0], select[1]]), self.lm_head, self.logit_budget)
