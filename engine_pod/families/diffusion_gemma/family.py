"""DiffusionGemma's record: its own config reader (config.json with generation_config.json), model,
checkpoint layout, random weights and sampler, served on canvases over a kept causal context."""

from __future__ import annotations

import torch

from dllm_contracts.families import FamilyDecoding
from engine_pod.families.diffusion_gemma.config import (
    MODEL_TYPE,
    TOP_DEFAULTS,
    diffusion_gemma_config,
    load_diffusion_gemma_config,
)
from engine_pod.families.diffusion_gemma.model import DiffusionGemmaModel
from engine_pod.families.diffusion_gemma.random_init import random_law
from engine_pod.families.diffusion_gemma.sampler_settings import (
    DEFAULT_MAX_DENOISING_STEPS,
    EntropyBoundParams,
)
from engine_pod.families.diffusion_gemma.shards import GemmaShards
from engine_pod.families.diffusion_gemma.weights import diffusion_gemma_sources
from engine_pod.families.record import ModelFamily
from engine_pod.kinds.canvas.kind import CANVAS


def _finish(model: DiffusionGemmaModel, _config, random: bool) -> None:
    """The constants no checkpoint holds; a random model's per-layer scalars too (ones)."""
    model.fill_constants(scalars=random)


def _count_parameters(config) -> int:
    """Counted on a meta model: shared tensors once, and meta experts cost nothing."""
    with torch.device("meta"):
        return sum(p.numel() for p in DiffusionGemmaModel(config).parameters())


FAMILY = ModelFamily(
    name=MODEL_TYPE,
    display_name="DiffusionGemma",
    summary="DiffusionGemma, uniform-noise canvases over a kept causal context",
    model_types=(MODEL_TYPE,),
    read_config=diffusion_gemma_config,
    read_directory=load_diffusion_gemma_config,
    architecture=DiffusionGemmaModel,
    kind=CANVAS,
    checkpoints="google/diffusiongemma-26B-A4B-it (text; mixture of experts)",
    tiny_preset="diffusion-gemma-tiny",
    # its config's canvas_length and its generation config's max_denoising_steps (transformers 5.24.0,
    # models/diffusion_gemma): a checkpoint with another canvas is served with decoding.blockLength set to it
    decoding=FamilyDecoding(
        block_length=int(TOP_DEFAULTS["canvas_length"]), steps_per_block=DEFAULT_MAX_DENOISING_STEPS
    ),
    read_sources=diffusion_gemma_sources,
    random_law=random_law,
    finish=_finish,
    count_parameters=_count_parameters,
    eos_from_directory=False,  # its generation config's EOS ids, as its reference generate's
    request_params=EntropyBoundParams,
    tensor_parallel=GemmaShards,
    expert_parallel=True,
)
