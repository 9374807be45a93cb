"""Helpers to run a workload through an engine with a given scheduler and collect outputs."""

from __future__ import annotations

import io
import json
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace

import torch

from dllm_contracts.request_params import GREEDY, RequestParams
from engine_pod.decoding.config import DecodingConfig
from engine_pod.engine import Engine
from engine_pod.loading.loader import LoadedModel
from engine_pod.models.forward_batch import ForwardBatch, KeyLayout, PoolSlots
from engine_pod.models.ragged import Box, RaggedAttention
from engine_pod.runner.contract import scheduling_facts
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.base import Scheduler


def run_workload(
    loaded: LoadedModel,
    scheduler,
    decoding: DecodingConfig,
    workload,
    order=None,
    sampling=None,
    grammars=None,
) -> dict[str, list[int]]:
    """Generated tokens per request id, submitting the workload in ``order`` (default: as given).
    ``scheduler``: a scheduler, or a callable that builds one from the runner's scheduling facts;
    ``sampling``: request id -> its settings but max_tokens (default: greedy); ``grammars``: request id ->
    the ResponseGrammar its answer keeps to (default: none)."""
    return run_engine(loaded, scheduler, decoding, workload, order, sampling, grammars)[0]


def run_engine(
    loaded: LoadedModel,
    scheduler,
    decoding: DecodingConfig,
    workload,
    order=None,
    sampling=None,
    grammars=None,
) -> tuple[dict[str, list[int]], Engine]:
    """``run_workload``'s outputs, and the engine that ran them (its cycles' records)."""
    engine = _engine_with(loaded, scheduler, decoding, workload, order, sampling=sampling, grammar=grammars)
    outputs: dict[str, list[int]] = {}
    engine.run(lambda r: outputs.__setitem__(r.request_id, list(r.generated)))
    return outputs, engine


def run_workload_logprobs(
    loaded: LoadedModel,
    scheduler,
    decoding: DecodingConfig,
    workload,
    order=None,
    sampling=None,
    logprobs=None,
) -> dict[str, tuple[list[int], list]]:
    """``run_workload``, each request's tokens with its committed tokens' log probabilities (``logprobs``:
    request id -> alternatives asked; the others' values are empty)."""
    engine = _engine_with(loaded, scheduler, decoding, workload, order, sampling=sampling, logprobs=logprobs)
    values: dict[str, list] = {request_id: [] for request_id, _, _ in workload}
    tokens: dict[str, list[int]] = {}
    while engine.has_work():
        result = engine.step()
        for request_id, kept in zip(result.output.request_ids, result.logprobs or []):
            values[request_id].extend(kept or [])
        tokens.update({r.request_id: list(r.generated) for r in result.finished})
    return {request_id: (tokens[request_id], values[request_id]) for request_id in tokens}


def _engine_with(
    loaded: LoadedModel, scheduler, decoding: DecodingConfig, workload, order, sampling=None, **settings
) -> Engine:
    """An engine with the workload submitted in ``order``; ``sampling``: request id -> its settings but
    max_tokens (absent: greedy); ``settings``: a setting's name -> (request id -> its value; absent: the
    default)."""
    pool_tokens = sum(len(prompt) + budget + 2 * decoding.block_length for _, prompt, budget in workload)
    runner = make_runner(loaded, decoding, pool_tokens)
    engine = Engine(runner, built_for(scheduler, runner))
    for request_id, prompt, budget in workload if order is None else [workload[i] for i in order]:
        given = {name: (values or {}).get(request_id) for name, values in settings.items()}
        given = {name: value for name, value in given.items() if value is not None}
        params = tokens(budget, (sampling or {}).get(request_id), **given)
        engine.add_request(engine.scheduler.request_for(request_id, prompt, params))
    return engine


def tokens(max_tokens: int, params: RequestParams | None = None, **settings) -> RequestParams:
    """``params`` (None: greedy) with ``max_tokens`` and any other ``settings`` set."""
    return replace(params or GREEDY, max_tokens=max_tokens, **settings)


def built_for(scheduler, runner) -> Scheduler:
    """``scheduler``, or what a callable (a scheduler class or ``functools.partial`` of one) builds with
    the runner's scheduling facts (a block-diffusion model's grid, its prefix cache)."""
    return scheduler if isinstance(scheduler, Scheduler) else scheduler(**scheduling_facts(runner))


def common_token(outputs: dict[str, list[int]], rank: int = 2) -> int:
    """A token the model emits often: declared EOS, it makes requests stop at different blocks."""
    counts = Counter(token for tokens in outputs.values() for token in tokens)
    return counts.most_common(rank + 1)[-1][0]


def block_causal_logits(model, ids: list[int], block_length: int) -> torch.Tensor:
    """One block-causal forward of a block-diffusion model over the whole sequence, through the paged pool."""
    n = len(ids)
    pool = model.new_pool(-(-n // 16), 16, torch.device("cpu"))
    pool.reserve("case", n)
    slots = pool.slots("case", 0, n)[None]
    positions = torch.arange(n)
    mask = (positions[None, :] // block_length <= positions[:, None] // block_length)[None]
    layout = KeyLayout(RaggedAttention.over_box(Box(1, n, n, mask), pool.device), PoolSlots(slots[0]))
    batch = ForwardBatch(torch.tensor([ids]), positions[None], {None: layout}, pool, slots[0])
    with torch.no_grad():
        return model.forward_batch(batch, (torch.zeros(n, dtype=torch.long), positions)).logits()


def dllm_generate_json(model, prompt_ids: list[int], *flags: str) -> dict:
    """`dllm generate --json` on ``model`` (a directory) for ``prompt_ids`` with ``flags``: its payload."""
    from engine_pod.cli.main import main

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(
            [
                "generate",
                "--model",
                str(model),
                "--prompt-ids",
                ",".join(map(str, prompt_ids)),
                *flags,
                "--json",
            ]
        )
    assert code == 0
    return json.loads(out.getvalue())


def in_process(argv: list[str]) -> tuple[int, dict | None, str]:
    """A `dllm ... --json` command (``argv`` after ``dllm``) run in this process, whose torch is already
    loaded: exit status, the payload it printed (None on failure), what it wrote to stderr."""
    from engine_pod.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, json.loads(out.getvalue()) if code == 0 else None, err.getvalue()
