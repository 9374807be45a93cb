"""Single-request generation through the engine (sequential scheduler): what ``dllm generate`` runs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine_pod.block_diffusion.generate import generate_blocks
from engine_pod.decoding.config import DecodingConfig, DecodingConfigError
from engine_pod.engine import Engine
from engine_pod.models.loader import LoadedModel
from engine_pod.runner.block_cycle import BlockCycleRunner
from engine_pod.scheduler.request import Request
from engine_pod.scheduler.static import sequential_scheduler
from engine_pod.text import completion_tokens, decode_completion


@dataclass
class GenerationResult:
    token_ids: list[int]  # the whole generated region, gen_length ids (EOS-filled after an early stop)
    text: str  # decoded up to the first EOS
    completion_tokens: int  # tokens up to and including the first EOS
    finish_reason: str
    num_forward_passes: int
    elapsed_s: float
    trace: list[dict]


def generate_one(
    loaded: LoadedModel, prompt_ids: list[int], gen_length: int, decoding: DecodingConfig, trace: bool = False
) -> GenerationResult:
    """Generate ``gen_length`` tokens (whole blocks) after ``prompt_ids``."""
    if loaded.config.block_diffusion:
        return _generate_block_diffusion(loaded, prompt_ids, gen_length, decoding)
    eos = loaded.config.eos_token_ids
    runner = BlockCycleRunner(loaded, decoding, record_trace=trace)
    scheduler = sequential_scheduler(
        decoding.block_length, eos, ignore_eos=decoding.ignore_eos, canvas=decoding.canvas
    )
    engine = Engine(runner, scheduler)
    request = Request.from_tokens("generate", prompt_ids, gen_length, decoding.block_length)
    engine.add_request(request)
    started = time.perf_counter()
    while engine.has_work():
        engine.step()
    elapsed = time.perf_counter() - started
    fill = eos[0] if eos else loaded.config.mask_token_id
    token_ids = (request.generated + [fill] * gen_length)[:gen_length]
    return GenerationResult(
        token_ids=token_ids,
        text=decode_completion(loaded.tokenizer, request.generated, eos, loaded.config.mask_token_id),
        completion_tokens=completion_tokens(request.generated, eos),
        finish_reason=request.finish_reason.value if request.finish_reason else "length",
        num_forward_passes=sum(r.forwards for r in engine.records),
        elapsed_s=elapsed,
        trace=list(runner.trace),
    )


# what a block-diffusion model's remasking names mean: its reference rule, with or without a threshold
_BLOCK_THRESHOLDS = {"threshold": None, "scheduled_threshold": None, "low_confidence": float("inf")}


def _generate_block_diffusion(
    loaded: LoadedModel, prompt_ids: list[int], gen_length: int, decoding: DecodingConfig
) -> GenerationResult:
    """LLaDA2.0's generation (block_diffusion/generate.py): blocks on the absolute grid, an exact KV cache
    (``--cache none``: the whole context recomputed at every step, as the reference does)."""
    if decoding.remasking not in _BLOCK_THRESHOLDS:
        raise DecodingConfigError(
            f"remasking {decoding.remasking!r} is not defined for block-diffusion models; "
            f"choose one of {sorted(_BLOCK_THRESHOLDS)}"
        )
    threshold = _BLOCK_THRESHOLDS[decoding.remasking]
    result = generate_blocks(
        loaded,
        prompt_ids,
        gen_length,
        decoding.block_length,
        decoding.steps_per_block,
        decoding.threshold if threshold is None else threshold,
        exact_cache=decoding.cache != "none",
    )
    eos = loaded.config.eos_token_ids
    fill = eos[0] if eos else loaded.config.mask_token_id
    return GenerationResult(
        token_ids=(result.output_ids + [fill] * gen_length)[:gen_length],
        text=decode_completion(loaded.tokenizer, result.output_ids, eos, loaded.config.mask_token_id),
        completion_tokens=completion_tokens(result.output_ids, eos),
        finish_reason="stop" if result.finished_by_eos else "length",
        num_forward_passes=result.forwards,
        elapsed_s=result.elapsed_s,
        trace=[],
    )
