"""Single-request generation through the engine (sequential scheduler): what ``dllm generate`` runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from dllm_contracts.request_params import GREEDY, RequestParams, family_settings_error
from dllm_contracts.text import completion_tokens, decode_completion, within_limit
from engine_pod.decoding.config import DecodingConfig
from engine_pod.engine import Engine
from engine_pod.loading.loader import LoadedModel
from engine_pod.runner.contract import scheduling_facts
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.static import sequential_scheduler


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
    loaded: LoadedModel,
    prompt_ids: list[int],
    gen_length: int,
    decoding: DecodingConfig,
    trace: bool = False,
    params: RequestParams = GREEDY,
) -> GenerationResult:
    """Generate ``gen_length`` tokens (whole blocks) after ``prompt_ids`` with the request's ``params``
    (its max_tokens is ``gen_length``). ValueError for family settings the model does not take."""
    eos = loaded.config.eos_token_ids
    pool_tokens = len(prompt_ids) + gen_length + 2 * decoding.block_length  # one request's exact cache
    runner = make_runner(loaded, decoding, pool_tokens, record_trace=trace)
    scheduler = sequential_scheduler(
        decoding.block_length,
        eos,
        ignore_eos=decoding.ignore_eos,
        masked_suffix=decoding.masked_suffix,
        layout="packed" if decoding.sparse.on else "dense",  # the head-sparse cache runs packed rows only
        **scheduling_facts(runner),
    )
    problem = family_settings_error(params.family, runner.request_defaults, loaded.family.display_name)
    if problem:
        raise ValueError(problem)
    engine = Engine(runner, scheduler)
    request = scheduler.request_for("generate", prompt_ids, replace(params, max_tokens=gen_length))
    engine.add_request(request)
    started = time.perf_counter()
    while engine.has_work():
        engine.step()
    elapsed = time.perf_counter() - started
    fill = eos[0] if eos else loaded.config.mask_token_id
    # whole blocks (on a block-diffusion grid: up to a block more) cut to the ask, as a worker answers
    generated, reason = within_limit(request.generated, gen_length, eos, decoding.ignore_eos)
    token_ids = (generated + [fill] * gen_length)[:gen_length]
    return GenerationResult(
        token_ids=token_ids,
        text=decode_completion(loaded.tokenizer, generated, eos, loaded.config.mask_token_id),
        completion_tokens=completion_tokens(generated, eos),
        finish_reason=reason,
        num_forward_passes=sum(r.forwards for r in engine.records),
        elapsed_s=elapsed,
        trace=list(runner.stepper.trace) if trace else [],
    )
