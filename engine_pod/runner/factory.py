"""The runner for a loaded model, chosen by its family's cache kind: the dual-cache runner (LLaDA, Dream),
the paged exact-cache runner (block diffusion: LLaDA2.0, SDAR), the canvas runner (DiffusionGemma)."""

from __future__ import annotations

from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import LoadedModel
from engine_pod.runner.canvas_cycle import CanvasCycleRunner
from engine_pod.runner.contract import Runner
from engine_pod.runner.dual_cycle import DualCacheRunner
from engine_pod.runner.paged_cycle import PagedCacheRunner

_POOLED_RUNNERS = {"paged": PagedCacheRunner, "canvas": CanvasCycleRunner}


def make_runner(
    loaded: LoadedModel,
    decoding: DecodingConfig,
    pool_tokens: int | None = None,
    record_trace: bool = False,
    record_margins: bool = False,
) -> Runner:
    """``pool_tokens`` sizes the KV pool (the token budget);
    ``record_trace`` (row 0's forwards and commits) and ``record_margins`` (each committed position's top-two
    gap) are recorded by the dual-cache runner and refused for the others, which record neither."""
    family = loaded.family
    if family.records_margins:
        return DualCacheRunner(loaded, decoding, pool_tokens, record_trace, record_margins)
    for name, asked in (("record_trace", record_trace), ("record_margins", record_margins)):
        if asked:
            raise ValueError(f"{name} is not supported for {family.display_name} ({family.cache} cache)")
    return _POOLED_RUNNERS[family.cache](loaded, decoding, pool_tokens)
