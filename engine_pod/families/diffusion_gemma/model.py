"""DiffusionGemma's text model: the causal encoder and the canvas decoder over one set of layers.

``encode`` runs the encoder over new context tokens (the prompt, later each committed canvas) and
writes their keys and values into each row's ``ContextCache`` (pages of a pool, reserved here); its
hidden states are not used, so its last layer only writes its keys and values (no attention, no MLP: a
third of a long context's encoding on the tiny preset, whose last layer is the full-attention one). ``denoise`` runs the decoder over one canvas (bidirectional, reading the
cache) and returns the softcapped float32 logits. Self-conditioning: the decoder's input embeddings are
``post_norm(embed(canvas) + GeGLU(pre_norm(soft)))`` where ``soft`` is the previous step's soft
prediction, ``softmax(processed logits) @ E * sqrt(D)`` (zeros at a canvas's first step);
``soft_embeddings`` computes it from the logits, so that a request carries [L, D] between steps
rather than [L, V] logits.

With ``tie_word_embeddings`` (every real checkpoint) the encoder's layers, embeddings and the LM head
are the decoder's tensors; only the per-layer output scalars differ between the two.
"""

from __future__ import annotations

import torch
from torch import nn

from engine_pod.device_buffers import DeviceBuffers
from engine_pod.families.diffusion_gemma.blocks import GeGLU, UnscaledRMSNorm
from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.families.diffusion_gemma.layer import GemmaLayer
from engine_pod.families.diffusion_gemma.rotary import GemmaRotary
from engine_pod.kinds.canvas.context_cache import ContextCache, ContextRows
from engine_pod.logit_count import LOGITS
from engine_pod.models.forward_batch import ForwardBatch
from engine_pod.models.layers import RMSNorm
from engine_pod.models.logit_budget import LogitBudget
from engine_pod.models.logit_head import apply_head, chunked_rows
from engine_pod.models.row_invariant import RowInvariantLinear, linear
from engine_pod.parallel.group import SINGLE, TensorParallel


class SelfConditioning(GeGLU):
    """Adds the processed soft prediction of the previous step to the canvas's input embeddings."""

    def __init__(self, config: DiffusionGemmaConfig) -> None:
        super().__init__(config.hidden_size, config.intermediate_size)
        self.pre_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_norm = UnscaledRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, embeddings: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        return self.post_norm(embeddings + super().forward(self.pre_norm(soft)))


class DiffusionGemmaModel(nn.Module):
    """Embeddings, layers (decoder's; the encoder's when untied), self-conditioning, final norm, LM head."""

    parallel: TensorParallel = (
        SINGLE  # a rank of a tensor-parallel group: its run of the vocabulary (shards.py)
    )
    # --batch-invariant (models/batch_invariant.py): the LM head and the soft embeddings through row_invariant.linear
    row_invariant = False

    def __init__(self, config: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_scale = config.hidden_size**0.5
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GemmaLayer(config, i) for i in range(config.num_layers))
        self.self_conditioning = SelfConditioning(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.register_buffer("encoder_layer_scalars", torch.ones(config.num_layers))
        self.register_buffer("decoder_layer_scalars", torch.ones(config.num_layers))
        if not config.tie_word_embeddings:  # the encoder's own weights and an LM head of its own
            self.encoder_embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            self.encoder_layers = nn.ModuleList(GemmaLayer(config, i) for i in range(config.num_layers))
            self.lm_head = RowInvariantLinear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = GemmaRotary(config)
        self.logit_budget = LogitBudget()  # the runner's (CycleRunner sets it from its DecodingConfig)

    def _encoder_parts(self) -> tuple[nn.Embedding, nn.ModuleList]:
        if self.config.tie_word_embeddings:
            return self.embed_tokens, self.layers
        return self.encoder_embed_tokens, self.encoder_layers

    def _embed(self, table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        return table(ids) * self._embed_scale(table.weight.dtype)

    def _embed_scale(self, dtype: torch.dtype) -> torch.Tensor:
        """sqrt(hidden) rounded to float32, then to ``dtype`` (the reference's), as a host scalar: a
        device's kernels take a 0-dim CPU tensor as a number, so nothing is copied per forward."""
        scales = self.__dict__.setdefault("_embed_scales", {})
        if dtype not in scales:
            scales[dtype] = torch.full((), self.embed_scale, dtype=torch.float32).to(dtype)
        return scales[dtype]

    def _run(
        self,
        x: torch.Tensor,
        layers: nn.ModuleList,
        batch: ForwardBatch,
        scalars: torch.Tensor,
        encoding: bool,
    ) -> torch.Tensor:
        tables = {
            kind: self.rotary.cos_sin(batch.positions, kind, x.dtype) for kind in set(self.config.layer_types)
        }
        last = len(layers) - 1
        for index, layer in enumerate(layers):
            cos, sin = tables[self.config.layer_types[index]]
            if encoding and index == last:  # its output, the encoder's hidden states, is never read
                layer.write_context(x, cos, sin, batch)
                return x
            x = layer(x, cos, sin, batch, scalars[index : index + 1], encoding)
        return x

    @torch.no_grad()
    def encode(self, token_ids: torch.Tensor, caches: ContextCache | list[ContextCache]) -> None:
        """Append row r of the context tokens token_ids [R, T] to caches[r] (its positions continue the
        row's context; its pool must have the pages); one cache stands for a list of one."""
        caches = _rows(caches)
        for cache in caches:
            cache.reserve(token_ids.shape[1])
        self._encode(token_ids, ContextRows.of(caches, token_ids.shape[1], encoding=True))

    @torch.no_grad()
    def encode_chunks(
        self, chunks: list[tuple[int, ...]], caches: list[ContextCache], buffers: DeviceBuffers | None = None
    ) -> None:
        """Append ``chunks[r]`` (context tokens, any lengths) to ``caches[r]``: one encoder forward over
        the chunks packed one after another, the tokens sent with the batch's layout in one copy (into
        ``buffers``: a runner's, or None: ``ContextRows.of``'s own)."""
        for cache, chunk in zip(caches, chunks):
            cache.reserve(len(chunk))
        flat = [token for chunk in chunks for token in chunk]
        lengths = [len(chunk) for chunk in chunks]
        rows = ContextRows.of(caches, lengths, {"tokens": flat}, encoding=True, buffers=buffers)
        self._encode(rows.extra["tokens"][None], rows)

    def _encode(self, token_ids: torch.Tensor, rows: ContextRows) -> None:
        """The encoder over token_ids ([R, T], or [1, N] packed as ``rows`` packs them), then the
        caches account for the tokens written."""
        table, layers = self._encoder_parts()
        batch = rows.forward(token_ids)
        self._run(self._embed(table, token_ids), layers, batch, self.encoder_layer_scalars, encoding=True)
        for cache, tokens in zip(rows.caches, rows.tokens):
            cache.advance(tokens)

    @torch.no_grad()
    def denoise(
        self,
        canvas: torch.Tensor,
        caches: ContextCache | list[ContextCache] | ContextRows,
        soft: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Softcapped float32 logits [R, L, V] of the canvases [R, L], row r over caches[r] (positions
        caches[r].length..), given the previous step's soft embeddings ``soft`` [R, L, D] (None: the
        canvases' first step). ``ContextRows`` of the caches may be reused over the steps of a canvas."""
        rows = caches if isinstance(caches, ContextRows) else ContextRows.of(_rows(caches), canvas.shape[1])
        batch = rows.forward(canvas)
        embeddings = self._embed(self.embed_tokens, canvas)
        soft = torch.zeros_like(embeddings) if soft is None else soft
        x = self.self_conditioning(embeddings, soft)
        x = self.norm(self._run(x, self.layers, batch, self.decoder_layer_scalars, encoding=False))
        logits = self._head_logits(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)
        cap = self.config.final_logit_softcapping
        return logits.div_(cap).tanh_().mul_(cap)  # tanh(logits / cap) * cap, in the linear's output

    def _head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 logits [n, V] of ``x`` [n, D], the head applied in ``logit_budget``'s chunks of positions
        (the sampler reads a canvas's logits whole: the chunks bound the head's own output in the weights'
        dtype and its gathered copy, not the float32 result)."""
        head = self.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight
        vocab = self.config.vocab_size

        product = linear if self.row_invariant else nn.functional.linear

        def apply(piece: torch.Tensor) -> torch.Tensor:
            return self.parallel.all_gather_last(product(piece, head))[..., :vocab]

        out = torch.empty(x.shape[0], vocab, dtype=torch.float32, device=x.device)
        start = 0
        for piece in chunked_rows(x, self.logit_budget, vocab):
            LOGITS.add(piece.shape[0], vocab)
            out[start : start + piece.shape[0]] = apply_head(apply, piece)
            start += piece.shape[0]
        return out

    @torch.no_grad()
    def soft_embeddings(
        self, processed_logits: torch.Tensor, probabilities: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The next step's self-conditioning input [R, L, D] from this step's processed logits [R, L, V].
        ``probabilities``: their float32 softmax where the sampler has it, the same tensor this softmax
        gives when the weights are float32 or float64 (the logits' cast to them is then exact)."""
        weight = self.embed_tokens.weight
        if probabilities is None or weight.dtype.itemsize < 4:
            probabilities = processed_logits.to(weight.dtype).softmax(dim=-1, dtype=torch.float32)
        probabilities = self._own_vocabulary(probabilities.to(weight.dtype), weight.shape[0])
        soft = (
            linear(probabilities, weight.t()) if self.row_invariant else torch.matmul(probabilities, weight)
        )
        return self.parallel.all_reduce(soft) * self._embed_scale(weight.dtype)

    def _own_vocabulary(self, probabilities: torch.Tensor, rows: int) -> torch.Tensor:
        """This rank's run of the vocabulary's probabilities (all of them for one process)."""
        if self.parallel.size == 1:
            return probabilities
        start, padded = self.parallel.rank * rows, rows * self.parallel.size
        return nn.functional.pad(probabilities, (0, padded - probabilities.shape[-1]))[
            ..., start : start + rows
        ]

    def fill_constants(self, scalars: bool = False) -> None:
        """The constant buffers that no checkpoint holds (after building on the meta device); ``scalars``:
        the per-layer output scalars too, ones (a random model, which has no checkpoint's)."""
        with torch.no_grad():
            if scalars:
                self.encoder_layer_scalars.fill_(1.0)
                self.decoder_layer_scalars.fill_(1.0)
            for module in self.modules():
                if isinstance(module, UnscaledRMSNorm):
                    module.weight.fill_(1.0)


def _rows(caches: ContextCache | list[ContextCache]) -> list[ContextCache]:
    return [caches] if isinstance(caches, ContextCache) else list(caches)
