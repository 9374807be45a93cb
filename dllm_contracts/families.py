"""The model families a DLLMService may name, and the decoding each one starts from (no torch).

The operator fills a service's unset ``decoding.blockLength`` and ``decoding.stepsPerBlock`` from here and
renders them as the engine's ``--block-length`` and ``--steps-per-block``. The CRD's CEL rules repeat these
numbers (a schema cannot import them; tests/operator/test_crd.py holds them equal), and the engine's config
readers own the checkpoint facts they stand for (tests hold those equal too).
"""

from __future__ import annotations

from dataclasses import dataclass

from dllm_contracts.canvas_sampler import DEFAULT_MAX_DENOISING_STEPS
from dllm_contracts.defaults import DEFAULT_BLOCK_LENGTH


@dataclass(frozen=True)
class FamilyDecoding:
    """What a family decodes with when the service does not say."""

    block_length: int  # tokens denoised together (DiffusionGemma: its canvas)
    steps_per_block: int  # denoising steps per block at most (DiffusionGemma: per canvas)


MASKED = FamilyDecoding(block_length=DEFAULT_BLOCK_LENGTH, steps_per_block=DEFAULT_BLOCK_LENGTH)
# DiffusionGemmaConfig.canvas_length and its generation config's max_denoising_steps (transformers 5.24.0,
# models/diffusion_gemma): a checkpoint with another canvas is served with decoding.blockLength set to it
DIFFUSION_GEMMA = FamilyDecoding(block_length=256, steps_per_block=DEFAULT_MAX_DENOISING_STEPS)

FAMILY_DECODING: dict[str, FamilyDecoding] = {
    "llada": MASKED,
    "dream": MASKED,
    "llada2": MASKED,  # block diffusion with an exact KV cache, a mixture of experts
    "sdar": MASKED,
    "diffusion_gemma": DIFFUSION_GEMMA,  # uniform noise on a canvas over a kept causal context
}
FAMILIES = tuple(FAMILY_DECODING)
DEFAULT_FAMILY = FAMILIES[0]
# how users know each family (help texts, the package summary and README name every one)
FAMILY_NAMES: dict[str, str] = {
    "llada": "LLaDA",
    "dream": "Dream",
    "llada2": "LLaDA2.0",
    "sdar": "SDAR",
    "diffusion_gemma": "DiffusionGemma",
}
FAMILIES_IN_WORDS = ", ".join(FAMILY_NAMES[family] for family in FAMILIES)


def family_decoding(family: str) -> FamilyDecoding:
    """The family's defaults; ValueError naming the families for one that is none of them."""
    if family not in FAMILY_DECODING:
        raise ValueError(f"model family {family!r} is not one of {', '.join(FAMILIES)}")
    return FAMILY_DECODING[family]
