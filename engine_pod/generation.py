"""Single-request generation through the engine (sequential scheduler): what ``dllm generate`` runs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine_pod.decoding.config import DecodingConfig
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
