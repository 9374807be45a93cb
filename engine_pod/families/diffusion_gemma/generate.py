"""A plain single-request DiffusionGemma generate: canvas after canvas over a kept context cache.

The reference loop (``DiffusionGemmaGenerationMixin.generate``) at batch 1: encode the prompt into the
context cache (in a pool of its own, sized for the prompt and every canvas but the last); then per canvas
(at most ``ceil(max_new_tokens / canvas_length)``): draw a uniform canvas, denoise it step by step
(``decoding/entropy_bound.py``) until the sampler stops it, commit the last step's argmax canvas, stop if
it holds an EOS id or the length is reached, else encode the committed canvas into the cache (positions
continue) and start the next. Whole canvases are returned, as the reference returns them (so up to
``canvas_length - 1`` tokens beyond ``max_new_tokens``), cut after the first EOS (where the reference
pads).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from engine_pod.decoding.entropy_bound import entropy_bound_step, start_canvas
from engine_pod.families.diffusion_gemma.model import DiffusionGemmaModel
from engine_pod.families.diffusion_gemma.multimodal import refuse_image_tokens
from engine_pod.families.diffusion_gemma.sampler_settings import EntropyBoundParams
from engine_pod.kinds.canvas.context_cache import ContextCache

logger = logging.getLogger(__name__)


@dataclass
class CanvasGeneration:
    """A request's generated tokens and how they were made."""

    tokens: list[int]  # whole canvases, cut after the first EOS
    steps_per_canvas: list[int] = field(default_factory=list)
    finish_reason: str = "length"  # "eos" or "length"


def _first_eos(tokens: list[int], eos_ids: tuple[int, ...]) -> int | None:
    return next((i for i, token in enumerate(tokens) if token in eos_ids), None)


def _denoise_canvas(
    model: DiffusionGemmaModel,
    cache: ContextCache,
    params: EntropyBoundParams,
    generator: torch.Generator,
    length: int,
) -> tuple[list[int], int]:
    """One canvas denoised until the sampler stops it: its committed tokens and its steps."""
    device = model.embed_tokens.weight.device
    rows = start_canvas([params], [generator], length, model.config.vocab_size, device)
    soft, steps = None, 0
    while True:
        result = entropy_bound_step(rows, model.denoise(rows.canvas, cache, soft))  # the step's one read
        steps += 1
        if result.done_rows[0]:
            return result.committed[0], steps
        soft = model.soft_embeddings(result.processed_logits, result.probabilities)


def generate(
    model: DiffusionGemmaModel,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    params: EntropyBoundParams | None = None,
    seed: int = 0,
    eos_token_ids: tuple[int, ...] | None = None,
    canvas_length: int | None = None,
) -> CanvasGeneration:
    """Generate for one request; its random draws come from a generator seeded with ``seed`` alone."""
    config = model.config
    if not prompt_ids:
        raise ValueError("the prompt must hold at least one token")
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    refuse_image_tokens(prompt_ids, config.multimodal_token_ids)
    params = params or EntropyBoundParams()
    eos_ids = config.eos_token_ids if eos_token_ids is None else tuple(eos_token_ids)
    length = canvas_length or config.canvas_length
    device = model.embed_tokens.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    canvases = math.ceil(max_new_tokens / length)
    dtype = model.embed_tokens.weight.dtype
    cache = ContextCache.alone(config, len(prompt_ids) + (canvases - 1) * length, dtype, device)
    model.encode(torch.tensor([prompt_ids], device=device), cache)
    result = CanvasGeneration(tokens=[])
    for canvas_index in range(canvases):
        tokens, steps = _denoise_canvas(model, cache, params, generator, length)
        result.tokens += tokens
        result.steps_per_canvas.append(steps)
        eos = _first_eos(tokens, eos_ids)
        if eos is not None:
            result.tokens = result.tokens[: len(result.tokens) - length + eos + 1]
            result.finish_reason = "eos"
            break
        if canvas_index + 1 < canvases:
            model.encode(torch.tensor([tokens], device=device), cache)
    logger.debug("generated %d tokens in %s steps", len(result.tokens), result.steps_per_canvas)
    return result
