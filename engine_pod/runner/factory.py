"""The block-cycle runner for a loaded model: the dual-cache runner for LLaDA and Dream, the exact-cache
runner for block-diffusion models (LLaDA2.0)."""

from __future__ import annotations

from engine_pod.decoding.config import DecodingConfig
from engine_pod.models.loader import LoadedModel
from engine_pod.runner.block_cycle import BlockCycleRunner


def make_runner(loaded: LoadedModel, decoding: DecodingConfig, pool_tokens: int | None = None, **options):
    """``options`` go to BlockCycleRunner (trace and margin recording); ``pool_tokens`` sizes a
    block-diffusion model's KV pool (the token budget)."""
    if loaded.config.block_diffusion:
        from engine_pod.block_diffusion.cycle_runner import BlockDiffusionCycleRunner

        return BlockDiffusionCycleRunner(loaded, decoding, pool_tokens)
    return BlockCycleRunner(loaded, decoding, **options)
