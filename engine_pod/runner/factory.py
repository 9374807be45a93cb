"""The runner for a loaded model, above every family's runner: the dual-cache runner for LLaDA and Dream,
the exact-cache runner for block-diffusion models (LLaDA2.0, SDAR), the canvas runner for DiffusionGemma."""

from __future__ import annotations

from engine_pod.decoding.config import DecodingConfig
from engine_pod.models.diffusion_gemma.config import MODEL_TYPE as DIFFUSION_GEMMA
from engine_pod.models.loader import LoadedModel
from engine_pod.runner.block_cycle import BlockCycleRunner
from engine_pod.runner.canvas_cycle import CanvasCycleRunner
from engine_pod.runner.contract import Runner
from engine_pod.runner.paged_cycle import BlockDiffusionCycleRunner


def make_runner(
    loaded: LoadedModel,
    decoding: DecodingConfig,
    pool_tokens: int | None = None,
    record_trace: bool = False,
    record_margins: bool = False,
) -> Runner:
    """``pool_tokens`` sizes a block-diffusion model's KV pool and DiffusionGemma's context pool (the
    token budget; LLaDA and Dream build their cache per cycle); ``record_trace`` (row 0's forwards and
    commits) and ``record_margins`` (each committed position's top-two gap) are recorded by the
    LLaDA/Dream runner and refused for a block-diffusion model or DiffusionGemma (its canvas runner),
    which record neither."""
    family = loaded.config.family
    if not records_margins(loaded.config):
        for name, asked in (("record_trace", record_trace), ("record_margins", record_margins)):
            if asked:
                raise ValueError(f"{name} is not supported for block-diffusion models ({family})")
        if family == DIFFUSION_GEMMA:
            return CanvasCycleRunner(loaded, decoding, pool_tokens)
        return BlockDiffusionCycleRunner(loaded, decoding, pool_tokens)
    return BlockCycleRunner(loaded, decoding, record_trace=record_trace, record_margins=record_margins)


def records_margins(config) -> bool:
    """Whether the family's runner can record margins and traces (LLaDA and Dream's runner does)."""
    return not (config.block_diffusion or config.family == DIFFUSION_GEMMA)
