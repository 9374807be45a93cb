"""The random DiffusionGemma preset (models/diffusion_gemma/random_init.py with the preset's sampler
settings): its canvases settle, each row at its own step, which is what a benchmark of it measures
(rows that stop early leave the forwards); its weights are the same for a seed and differ across seeds."""

from __future__ import annotations

import pytest
import torch

from engine_pod.decoding.config import DecodingConfig
from engine_pod.models.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput

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
    assert generation["t_max"] < 0.1 and generation["sampler_config"]["entropy_bound"] >= 100


def test_the_draw_is_deterministic_per_seed():
    def weights(seed: int) -> torch.Tensor:
        return load_model(MODEL, seed=seed).model.layers[0].self_attn.q_proj.weight

    assert torch.equal(weights(0), weights(0)) and not torch.equal(weights(0), weights(1))
