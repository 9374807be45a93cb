"""The random DiffusionGemma preset (models/diffusion_gemma/random_init.py with the preset's sampler
settings): its canvases settle, each row at its own step, which is what a benchmark of it measures
(rows that stop early leave the forwards); its weights are the same for a seed and differ across seeds,
the same model in every dtype; in float32 a request's tokens are the same alone and in any batch (the
benchmark's outputs are compared across policies), and an expert rounds a token alike however many
tokens chose it."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.kinds.canvas.context_cache import ContextCache, ContextRows, context_pool
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.static import StaticScheduler, sequential_scheduler
from tests.engine_utils import run_workload

MODEL = "random:diffusion-gemma-tiny"
STEPS = 32  # the engine's steps per block, the sampler's step limit per canvas


@pytest.fixture(scope="module")
def loaded():
    return load_model(MODEL)


def test_canvases_stop_before_their_step_limit_each_at_its_own_step(loaded):
    runner = make_runner(loaded, DecodingConfig(block_length=32, steps_per_block=STEPS), pool_tokens=4096)
    prompts = [
        tuple(torch.randint(3, 1024, (8 + 23 * i,), generator=torch.Generator().manual_seed(i)).tolist())
        for i in range(6)
    ]
    output = runner.run(SchedulerOutput.of_rows([CycleRow(p, owner=str(i)) for i, p in enumerate(prompts)]))
    assert min(output.steps) < STEPS, output.steps  # adaptive stopping fired
    assert len(set(output.steps)) > 1, output.steps  # rows stop at different steps
    assert output.stats.forwards == max(output.steps)  # the cycle ends with its slowest row


def test_the_preset_carries_sampler_settings_its_random_weights_settle_under(loaded):
    generation = loaded.config.generation
    assert generation["t_max"] <= 0.1 and generation["sampler_config"]["entropy_bound"] >= 100


def test_the_draw_is_deterministic_per_seed():
    def weights(seed: int) -> torch.Tensor:
        return load_model(MODEL, seed=seed).model.layers[0].self_attn.q_proj.weight

    assert torch.equal(weights(0), weights(0)) and not torch.equal(weights(0), weights(1))


def test_every_dtype_holds_the_same_model():
    f32, f64 = (load_model(MODEL, dtype=dtype).model.embed_tokens.weight for dtype in ("float32", "float64"))
    assert f64.dtype == torch.float64 and torch.equal(f64, f32.to(torch.float64))


def test_a_requests_tokens_are_the_same_alone_and_in_any_batch_in_float32(loaded):
    """Sampled draws scale a logit's last bit by 1 / temperature, so only bit-equal logits keep a
    request's tokens: BlockServe's mixed batches and static batches give each request its tokens alone."""
    # prompts of every size class, answers of one or two blocks: rows leave at different cycles
    lengths = [(5, 64), (40, 32), (131, 32), (17, 64), (90, 32), (8, 32)]
    workload = [
        (str(i), torch.randint(3, 1024, (p,), generator=torch.Generator().manual_seed(i)).tolist(), g)
        for i, (p, g) in enumerate(lengths)
    ]
    sampling = {request_id: RequestParams(seed=int(request_id)) for request_id, _, _ in workload}
    decoding = DecodingConfig(block_length=32, steps_per_block=STEPS)
    run = partial(run_workload, loaded, decoding=decoding, workload=workload, sampling=sampling)
    alone = run(partial(sequential_scheduler, 32, []))
    assert run(partial(BlockServeScheduler, 32, [], SchedulerConfig(token_budget=300))) == alone
    assert run(partial(StaticScheduler, 32, [], batch_size=4)) == alone


def test_a_rows_logits_are_bit_equal_alone_and_in_a_batch_in_float32(loaded):
    model, generator = loaded.model, torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 1024, (1, 5 + 17 * r), generator=generator) for r in range(8)]
    canvas = torch.randint(0, 1024, (8, 32), generator=generator)
    soft = torch.randn(8, 32, 128, generator=generator)

    def caches(rows):  # in one pool of their own (the batch's rows share it)
        pool = context_pool(model.config, 40, 32, torch.float32, torch.device("cpu"))
        made = [ContextCache(pool, str(row), model.config) for row in rows]
        for cache, row in zip(made, rows):
            model.encode(prompts[row], cache)
        return made

    batch = model.denoise(canvas, caches(range(8)), soft)
    for row in range(8):
        assert torch.equal(
            model.denoise(canvas[row : row + 1], caches([row]), soft[row : row + 1])[0], batch[row]
        )


def test_an_expert_rounds_a_token_alike_however_many_tokens_chose_it(loaded):
    experts = loaded.model.layers[0].experts
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(0))
    together = experts._expert(3, x)
    for count in (1, 2, 3, 4):
        assert torch.equal(experts._expert(3, x[:count]), together[:count])


@pytest.mark.parametrize("prompt_tokens", [1, 2, 3])
def test_a_prompt_of_fewer_tokens_than_a_matrix_kernels_rows_encodes_alike_alone_and_batched(
    loaded, prompt_tokens
):
    """Alone, a prompt of 1-3 tokens is a matrix of 1-3 rows in every linear layer of the encoder, which a
    CPU's BLAS rounds with other kernels than the same prompts batched (``models/row_invariant.py``)."""
    model, generator = loaded.model, torch.Generator().manual_seed(prompt_tokens)
    prompts = torch.randint(3, 1024, (3, prompt_tokens), generator=generator)
    canvas = torch.randint(0, 1024, (3, 32), generator=generator)

    def logits(rows: list[int]) -> torch.Tensor:
        pool = context_pool(model.config, 8, 32, torch.float32, torch.device("cpu"))
        caches = [ContextCache(pool, str(row), model.config) for row in rows]
        model.encode(prompts[rows], caches)  # the rows' prompts in one encoder forward
        return model.denoise(canvas[rows], caches)

    batched = logits([0, 1, 2])
    for row in range(3):
        assert torch.equal(logits([row])[0], batched[row])


def test_chunks_of_any_lengths_encode_in_one_forward_as_each_alone(loaded):
    """The runner's encoder forward: every row's chunk packed one after another (a rebuilt row's next
    chunk continues its context) writes the keys and values each row's forward alone writes."""
    model, generator = loaded.model, torch.Generator().manual_seed(1)
    chunks = [tuple(torch.randint(3, 1024, (n,), generator=generator).tolist()) for n in (5, 40, 1, 17)]
    canvas = torch.randint(0, 1024, (4, 32), generator=generator)

    def contexts(rows: list[int], together: bool) -> list[ContextCache]:
        pool = context_pool(model.config, 16, 32, torch.float32, torch.device("cpu"))
        caches = [ContextCache(pool, str(row), model.config) for row in rows]
        for part in (slice(None, 3), slice(3, None)):  # the second chunk continues the first (none: row 2)
            if together:
                model.encode_chunks([chunks[row][part] for row in rows], caches)
            else:
                for row, cache in zip(rows, caches):
                    if chunks[row][part]:
                        model.encode(torch.tensor([chunks[row][part]]), cache)
        return caches

    packed = contexts([0, 1, 2, 3], together=True)
    assert [cache.length for cache in packed] == [5, 40, 1, 17]
    batch = model.denoise(canvas, packed)
    for row in range(4):
        alone = contexts([row], together=False)
        assert torch.equal(model.denoise(canvas[row : row + 1], alone)[0], batch[row])


def test_rows_picked_out_of_a_batch_on_the_device_see_what_a_batch_of_them_sees(loaded):
    """When rows stop, the runner picks the rest out of the batch's layout on the device, with no copy
    from the host: their logits are those of a batch made of them alone."""
    model, generator = loaded.model, torch.Generator().manual_seed(2)
    pool = context_pool(model.config, 40, 32, torch.float32, torch.device("cpu"))
    caches = [ContextCache(pool, str(row), model.config) for row in range(6)]
    prompts = [
        tuple(torch.randint(3, 1024, (3 + 29 * row,), generator=generator).tolist()) for row in range(6)
    ]
    model.encode_chunks(prompts, caches)
    canvas = torch.randint(0, 1024, (6, 32), generator=generator)
    soft = torch.randn(6, 32, 128, generator=generator)
    batch = ContextRows.of(caches, 32)
    for keep in ([0, 2, 3, 5], [5], [1, 4]):
        index = torch.tensor(keep)
        picked = model.denoise(canvas[keep], batch.rows(keep, index), soft[keep])
        alone = model.denoise(canvas[keep], ContextRows.of([caches[r] for r in keep], 32), soft[keep])
        assert torch.equal(picked, alone), keep
    twice = batch.rows([0, 2, 3, 5], torch.tensor([0, 2, 3, 5])).rows([1, 3], torch.tensor([1, 3]))
    assert torch.equal(
        model.denoise(canvas[[2, 5]], twice, soft[[2, 5]]),
        model.denoise(canvas[[2, 5]], [caches[2], caches[5]], soft[[2, 5]]),
    )
