"""The bidirectional transformer both LLaDA and Dream are built from.

One entry point, ``forward_batch``: a forward batch (models/forward_batch.py) says which tokens at which
positions, where their keys and values go in the KV pool and what each row attends over (the runner's
builders make a refresh over the whole canvas, or a window of it over the cached rest:
kinds/bidirectional/box_batches.py, kinds/bidirectional/packing.py). The LM head runs only on the positions the caller selects,
never on the whole sequence.
"""

from __future__ import annotations

import torch
from torch import nn

from engine_pod.logit_count import LOGITS
from engine_pod.models.config import ModelConfig
from engine_pod.models.forward_batch import ForwardBatch
from engine_pod.models.layers import DecoderBlock, RMSNorm, RotaryEmbedding
from engine_pod.models.logit_budget import LogitBudget
from engine_pod.models.logit_head import apply_head, candidate_logits, chunked_rows
from engine_pod.models.paged_kv import PagedKVPool, model_pool


class SelectedHidden:
    """Final hidden states of selected positions; the LM head is applied by ``map_logits`` in the chunks
    and over the columns its ``LogitBudget`` (models/logit_budget.py) decides.

    Chunking bounds the logits' memory (rows x block x vocabulary would dominate with 126k-152k
    vocabularies) by a constant, so peak memory stays linear in the tokens of the batch.
    """

    def __init__(self, hidden: torch.Tensor, lm_head: nn.Linear, budget: LogitBudget | None = None) -> None:
        self.hidden = hidden
        self.lm_head = lm_head
        self.budget = budget or LogitBudget()
        self.vocab = getattr(lm_head, "vocab_size", lm_head.out_features)  # a split head: all ranks'
        self.chunk = self.budget.chunk(self.vocab)

    @property
    def restricts(self) -> bool:
        """Whether ``map_logits`` gives ``fn`` candidate columns rather than the whole vocabulary."""
        return self.budget.columns(self.vocab) < self.vocab

    def map_logits(self, fn, tokens: tuple[int, ...] = (), never: int | None = None):
        """Apply ``fn(logits) -> tuple of [n, ...] tensors`` chunk by chunk and concatenate the results.
        Where candidates restrict the columns, ``fn`` gets each position's candidates' logits [n, k]
        (``never``: a token id never among them) and its outputs at ``tokens`` (column indices) are
        mapped back to token ids."""
        k = self.budget.columns(self.vocab)
        parts = []
        for piece in chunked_rows(self.hidden, self.budget, self.vocab):
            LOGITS.add(piece.shape[0], k)
            if k == self.vocab:
                parts.append(fn(apply_head(self.lm_head, piece)))
                continue
            logits, ids = candidate_logits(piece, self.lm_head, k, never)
            out = list(fn(logits))
            for index in tokens:
                out[index] = _token_ids(ids, out[index])
            parts.append(tuple(out))
        return tuple(torch.cat(items) for items in zip(*parts))

    def logits(self) -> torch.Tensor:
        return self.lm_head(self.hidden)

    def rows(self, index: torch.Tensor) -> SelectedHidden:
        """The positions ``index`` picks, under the same head and budget."""
        return SelectedHidden(self.hidden.index_select(0, index), self.lm_head, self.budget)


def _token_ids(ids: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Candidate columns [n] or [n, w] as the token ids ``ids`` [n, k] gives them."""
    if columns.dim() == 1:
        return ids.gather(1, columns[:, None])[:, 0]
    return ids.gather(1, columns)


class DiffusionTransformer(nn.Module):
    """Embedding, pre-norm decoder blocks without a causal mask, final norm, untied LM head. A model whose
    layers are wired otherwise is a subclass naming its ``block_type`` (called as ``DecoderBlock``)."""

    block_type: type[DecoderBlock] = DecoderBlock

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.block_type(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.logit_budget = LogitBudget()  # the runner's (CycleRunner sets it from its DecodingConfig)

    def fuse_projections(self) -> None:
        """Inference: each layer's q, k and v projections as one matmul (see ``Attention.fuse_projections``)."""
        for layer in self.layers:
            layer.attn.fuse_projections()

    def new_pool(self, num_pages: int, page_size: int, device: torch.device) -> PagedKVPool:
        """A KV pool of this model's layers and heads, in its weights' dtype."""
        return model_pool(self.config, num_pages, page_size, self.lm_head.weight.dtype, device)

    def forward_batch(self, batch: ForwardBatch, select: tuple[torch.Tensor, torch.Tensor]) -> SelectedHidden:
        """The selected (row, token) pairs' final hidden states. Where the batch has a last-layer layout
        (packed rows), the last layer computes only the selected positions (rows of the packed [1, N],
        grouped by row in row order, as its plan has them)."""
        hidden = self.embed_tokens(batch.tokens)
        cos, sin = self.rotary.cos_sin(batch.positions, hidden.dtype)
        for layer in self.layers[:-1]:
            hidden = layer(hidden, cos, sin, batch)
        if batch.final is None:
            hidden = self.layers[-1](hidden, cos, sin, batch)
            return SelectedHidden(self.norm(hidden[select[0], select[1]]), self.lm_head, self.logit_budget)
        hidden = self.layers[-1](hidden, cos, sin, batch, select[1])
        return SelectedHidden(self.norm(hidden[0]), self.lm_head, self.logit_budget)

    def forward_layers(
        self, batch: ForwardBatch, hidden: torch.Tensor | None, start: int, end: int, last: torch.Tensor
    ) -> torch.Tensor:
        """Layers ``[start, end)`` of ``batch``'s forward (a refresh split across cycles), from ``hidden``,
        the states entering layer ``start`` (None: the tokens' embedding), each writing its keys and values
        where the batch says; the states leaving layer ``end - 1``. The model's last layer computes only the
        packed positions ``last`` (its keys and values are every position's, as ``forward_batch``'s)."""
        if hidden is None:
            hidden = self.embed_tokens(batch.tokens)
        cos, sin = self.rotary.cos_sin(batch.positions, hidden.dtype)
        final = len(self.layers) - 1
        for index in range(start, end):
            hidden = self.layers[index](hidden, cos, sin, batch, last if index == final else None)
        return hidden

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Plain batch-1-style forward over unpadded rows: logits for every token."""
        rows, tokens = input_ids.shape
        positions = torch.arange(tokens, device=input_ids.device).expand(rows, tokens)
        key_mask = torch.ones(rows, tokens, dtype=torch.bool, device=input_ids.device)
        batch = ForwardBatch.box_over_itself(input_ids, positions, key_mask)
        every = torch.arange(rows * tokens, device=input_ids.device)
        return self.forward_batch(batch, (every // tokens, every % tokens)).logits().view(rows, tokens, -1)
