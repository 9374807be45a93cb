"""DiffusionGemma in `dllm profile` (canvas-shaped grid: the narrowest rows, the most canvases per token)
and the random tiny preset for benchmarks (`random:diffusion-gemma-tiny`) through BlockServe."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model, parameter_count
from engine_pod.profiling import points
from engine_pod.profiling.grid import Point, grid
from engine_pod.profiling.points import measure_point
from engine_pod.profiling.profiler import ProfileConfig, check_shape, for_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import run_workload

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "diffusion_gemma_reference"


def test_the_profile_takes_the_canvas_and_shapes_rows_as_canvases():
    cfg = for_model(ProfileConfig(model=str(REFERENCE), block_length=None))
    assert cfg.canvas and cfg.block_length == 16
    assert for_model(ProfileConfig(model=str(REFERENCE), block_length=32)).block_length == 32
    points = grid(2048, 16, canvas=True)
    assert {p.width for p in points} == {17}  # a one-token context and its canvas
    fitted = [p.tokens for p in points if not p.held_out]
    assert len(fitted) >= 4 and max(fitted) <= 2048 and sum(p.held_out for p in points) == 2
    assert check_shape(1000, cfg) == Point(58, 17)


def test_a_profiled_canvas_cycle_runs_at_its_shape():
    loaded = load_model(str(REFERENCE))
    cfg = for_model(ProfileConfig(model=str(REFERENCE), block_length=None, steps=3))
    point = measure_point(loaded, Point(6, 17), cfg)
    assert point.peak_bytes > 0 and (point.rows, point.width) == (6, 17)


def test_a_profiled_canvas_cycle_is_measured_with_its_context_pool_allocated(monkeypatch):
    """The runner's pool holds the point's tokens (the budget the fit turns them into sizes the engine's
    pool the same way) and exists before the peak is reset, so the measured peak includes it."""
    loaded = load_model(str(REFERENCE))
    cfg = for_model(ProfileConfig(model=str(REFERENCE), block_length=None, steps=3))
    runners, pool_at_reset = [], []
    monkeypatch.setattr(
        points, "make_runner", lambda *a, **k: runners.append(make_runner(*a, **k)) or runners[-1]
    )
    monkeypatch.setattr(
        points,
        "group_reset_peak",
        lambda loaded, **_: pool_at_reset.append(runners[-1].stepper.pool.nbytes()),
    )
    measure_point(loaded, Point(6, 17), cfg)
    pool = runners[0].stepper.pool
    per_slot = sum(keys[0].nbytes + values[0].nbytes for keys, values in zip(pool.keys, pool.values))
    assert pool_at_reset == [pool.nbytes()] == [(7 * 16 + 1) * per_slot]  # ceil(6 x 17 / 16) pages
    assert pool.free_pages == 1  # each row's one-token context holds a page


@pytest.fixture(scope="module")
def tiny():
    return load_model("random:diffusion-gemma-tiny")


def test_the_random_tiny_preset_loads_as_the_family(tiny):
    config = tiny.config
    assert config.family == "diffusion_gemma" and config.canvas_length == 32
    assert parameter_count(config) == sum(p.numel() for p in tiny.model.parameters())
    assert tiny.model.decoder_layer_scalars.eq(1).all() and tiny.model.encoder_layer_scalars.eq(1).all()


def test_the_random_tiny_preset_runs_under_blockserve_as_alone(tiny):
    workload = [("a", [5, 6, 7], 64), ("b", list(range(10, 50)), 32), ("c", [9] * 70, 96)]
    sampling = {request_id: RequestParams(seed=i) for i, (request_id, _, _) in enumerate(workload)}
    decoding = DecodingConfig(block_length=32, steps_per_block=3)
    alone = run_workload(tiny, partial(sequential_scheduler, 32, []), decoding, workload, sampling=sampling)
    blockserve = partial(BlockServeScheduler, 32, [], SchedulerConfig(token_budget=300))
    together = run_workload(tiny, blockserve, decoding, workload, sampling=sampling)
    assert together == alone and [len(alone[r]) for r, _, _ in workload] == [64, 32, 96]


def test_dllm_bench_reports_the_entropy_bound_samplers_settings_not_a_threshold(tmp_path, capsys):
    from engine_pod.cli.main import main

    out = tmp_path / "bench.json"
    argv = [
        "bench",
        "--model",
        "random:diffusion-gemma-tiny",
        "--workload",
        "synthetic:n=3,prompt=4-12,gen=32-32,seed=0",
    ]
    assert main([*argv, "--policy", "blockserve", "--no-isolate", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["family_settings"] == {
        "max_denoising_steps": 32,  # the steps per block
        "entropy_bound": 1000.0,  # the preset's generation config
        "t_min": 0.05,
        "t_max": 0.1,
        "stability_threshold": 0,
        "confidence_threshold": 1.0,
    }
    printed = capsys.readouterr().out
    assert "the family's settings: max_denoising_steps 32, entropy_bound 1000, t_min 0.05" in printed
    assert "threshold 0.9" not in printed
