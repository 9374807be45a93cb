"""Offline peak-memory profiling: real block cycles over a grid of batch shapes -> a token budget.

For a block-diffusion model (and DiffusionGemma, whose context lives in a pool too) the batch's tokens
are also the KV pool's: the pool is allocated for them before the peak is reset, so the budget counts
what a request holds (its context's KV pages and its active block or canvas).

Each grid point runs one block cycle (a refresh forward plus cached steps) on a batch of
``rows x width`` tokens. CUDA points run in this process between allocator peak resets and record
the reserved peak (what the device gives up, fragmentation included) beside the allocated one; CPU
points run one after another in one fresh process, each in a window of peak resident memory whose floor
is that process's peak from its imports and model load: what a fresh engine process reaches at that
shape. The budget the fit gives is then measured once at its own size and lowered until that peak fits.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from tqdm import tqdm

from dllm_contracts.defaults import DEFAULT_BLOCK_LENGTH
from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.scheduler_config import DEFAULT_LAYOUT
from engine_pod.allocators import CUDA_ALLOC_CONF, describe_allocator, release_free_cpu_memory
from engine_pod.decoding.config import DecodingConfig
from engine_pod.device_memory import (
    available_memory,
    device_name,
    peak_allocated_bytes,
    resident_windows,
    total_memory,
)
from engine_pod.families.registry import family_of
from engine_pod.group_processes import ModelArgs, tensor_parallel_group
from engine_pod.isolation import ChildDied, ChildSession, run_in_child
from engine_pod.loading.loader import LoadedModel, load_metadata, parse_device, parse_dtype
from engine_pod.loading.sharded import build_part, model_plan
from engine_pod.parallel.group import TensorParallel
from engine_pod.parallel.place import GroupPlace
from engine_pod.profiling.cache_share import cache_share
from engine_pod.profiling.extrapolation import Extrapolation
from engine_pod.profiling.fit import MemoryFit, fit_peak
from engine_pod.profiling.grid import Point, grid
from engine_pod.profiling.room import no_block_fits, smallest_too_large
from engine_pod.runner.factory import make_runner
from engine_pod.runner.tensor_parallel import group_peak, group_reset_peak
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput

logger = logging.getLogger(__name__)


class ProfileError(ValueError):
    """The profile cannot produce a usable budget (limit below the weights, grid too large, ...)."""


@dataclass(frozen=True)
class ProfileConfig:
    model: str
    device: str = "cpu"
    dtype: str = "float32"
    block_length: int | None = 32  # None: the model's (DiffusionGemma: its canvas; else 32)
    steps: int = 4  # denoising steps per profiled block cycle (peak is reached by the first cached step)
    memory_limit: int | None = None  # memory the engine may have; default: what the device has free
    utilization: float = 0.9  # share of it to plan for
    max_tokens: int = 16384  # largest batch (rows x width) on the grid
    seed: int = 0
    layout: str = DEFAULT_LAYOUT  # how the engine lays batches out (the budget counts that layout's tokens)
    canvas: bool = False  # rows of one canvas each over a kept context (DiffusionGemma): set by run_profile
    family: str | None = None  # the family the checkpoint must be (None: any)
    tensor_parallel: int = 1  # ranks the model is split across: each rank's peak measured, the worst kept
    expert_parallel: int = 1  # sets of ranks a mixture of experts' experts are spread over
    max_materialized_logits: int | None = None  # the engine's logit budget (DecodingConfig), in force
    logit_candidates: int = 0  # and its candidates (0: the whole vocabulary)
    batch_invariant: bool = False  # the engine's products row-invariant (DecodingConfig.batch_invariant)
    sparse: HeadSparseConfig = HeadSparseConfig()  # the head-sparse cache the engine will run (off: dense)


def _rows_for(point: Point, loaded: LoadedModel, block_length: int, seed: int) -> list[CycleRow]:
    rng = random.Random(seed)
    special = {loaded.config.mask_token_id, *loaded.config.eos_token_ids}
    vocab = [t for t in range(min(loaded.config.vocab_size, 4096)) if t not in special]
    prefix = point.width - block_length
    return [CycleRow(tuple(rng.choice(vocab) for _ in range(prefix))) for _ in range(point.rows)]


CHECK_WIDTH = 1024  # width of the batch that checks the budget (narrower when the budget is small)
MAX_CHECKS = 3  # measurements at the budget, each lowering it when its peak was over the limit
# after an overshoot, aim this share of the headroom below the limit (peaks are noisy)
CORRECTION_MARGIN = 0.03


def measure_point(loaded: LoadedModel, point: Point, cfg: ProfileConfig) -> Point:
    """One real block cycle at this shape (low-confidence quota: exactly cfg.steps forwards), measured."""
    decoding = DecodingConfig(
        block_length=cfg.block_length,
        steps_per_block=cfg.steps,
        remasking="low_confidence",
        max_materialized_logits=cfg.max_materialized_logits,
        logit_candidates=cfg.logit_candidates,
        batch_invariant=cfg.batch_invariant,
        sparse=cfg.sparse,
    )
    runner = make_runner(loaded, decoding, pool_tokens=point.tokens)  # a KV pool for every token
    rows = _rows_for(point, loaded, cfg.block_length, cfg.seed)
    group_reset_peak(loaded, resident_window=True)  # CPU: a window of its own (_measure_in_one_process)
    runner.run(SchedulerOutput.of_rows(rows, gather_rows=False, packed=cfg.layout == "packed"))
    peak, allocated = group_peak(loaded), peak_allocated_bytes(loaded.device)  # the worst rank's peak
    return Point(point.rows, point.width, peak, point.held_out, allocated)


def _model(cfg: ProfileConfig):
    """The model (this process's rank of it) for as long as the context lasts."""
    args = ModelArgs(cfg.model, cfg.device, cfg.dtype, cfg.seed, cfg.family)
    return tensor_parallel_group(_place(cfg), args)


def _place(cfg: ProfileConfig) -> GroupPlace:
    return GroupPlace(cfg.tensor_parallel, expert=cfg.expert_parallel)


def measure_in_fresh_process(cfg: ProfileConfig, point: Point) -> Point:
    """One point in this process, the model loaded for it (``run_in_child`` gives it a fresh process)."""
    with _model(cfg) as loaded:
        return measure_point(loaded, point, cfg)


def _measure_in_one_process(calls, answers, cfg: ProfileConfig) -> None:
    """CPU points one after another in this fresh process, each in a peak window of its own whose floor is
    the process's peak before the first (``device_memory.reset_peak``): what a fresh process reaches at
    that shape. Each answer: the point and whether its window was its own."""
    with _model(cfg) as loaded:
        while (point := calls.get()) is not None:
            gc.collect()  # what the last point left in reference cycles goes before the next window,
            release_free_cpu_memory()  # and what the C heap keeps free of it is given back
            answers.put((measure_point(loaded, point, cfg), resident_windows()))


@dataclass(frozen=True)
class _InProcessPoints:
    """CUDA points in this process, between allocator peak resets."""

    loaded: LoadedModel
    cfg: ProfileConfig
    measured_in: str = "this process"

    def measure(self, point: Point) -> Point:
        return measure_point(self.loaded, point, self.cfg)


class _CpuPoints:
    """CPU points measured in one fresh process (the model loaded once); where the kernel does not let a
    process reset its peak, each point after the first in a fresh process of its own."""

    def __init__(self, cfg: ProfileConfig) -> None:
        self._cfg = cfg
        self._session: ChildSession | None = ChildSession(_measure_in_one_process, cfg)
        self.measured_in = "one fresh process"

    def __enter__(self) -> _CpuPoints:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def measure(self, point: Point) -> Point:
        if self._session is None:
            return run_in_child(measure_in_fresh_process, self._cfg, point)
        measured, own_window = self._session.ask(point)
        if not own_window:  # the process's first point is its own all the same; the next would not be
            self.__exit__()
            self.measured_in = "a fresh process each"
        return measured


def _measured(measure: Callable[[Point], Point], point: Point) -> Point:
    try:
        return measure(point)
    except ChildDied as exc:
        raise ProfileError(
            f"profiling {point.rows}x{point.width} tokens failed ({exc}); the grid does not fit this device: "
            "lower --max-tokens"
        ) from None


def check_shape(budget: int, cfg: ProfileConfig) -> Point:
    """A batch of at most ``budget`` tokens and as close to it as whole rows allow (canvases: the
    narrowest rows, the most canvases)."""
    if cfg.canvas:
        return Point(max(1, budget // (cfg.block_length + 1)), cfg.block_length + 1)
    rows = max(1, budget // min(CHECK_WIDTH, budget))
    return Point(rows, budget // rows)


def for_model(cfg: ProfileConfig) -> ProfileConfig:
    """``cfg`` with what the model decides: whether its rows are canvases, the block length it takes."""
    config, _ = load_metadata(cfg.model, cfg.family)
    canvas = family_of(config).kind.canvas_rows
    block_length = cfg.block_length or (config.canvas_length if canvas else DEFAULT_BLOCK_LENGTH)
    if cfg.max_tokens < 4 * block_length:
        raise ProfileError(
            f"--max-tokens must be at least {4 * block_length} (four blocks of {block_length})"
        )
    return replace(cfg, canvas=canvas, block_length=block_length)


def run_profile(cfg: ProfileConfig, progress: bool = True) -> dict:
    cfg = for_model(cfg)
    device = parse_device(cfg.device)
    total, available = total_memory(device), available_memory(device)
    limit = cfg.memory_limit if cfg.memory_limit is not None else available
    usable = int(limit * cfg.utilization)
    with contextlib.ExitStack() as held:
        if device.type == "cuda":
            loaded = held.enter_context(_model(cfg))
            points, weights = _InProcessPoints(loaded, cfg), loaded.weights_bytes
        else:
            points, weights = held.enter_context(_CpuPoints(cfg)), _weights_bytes(cfg)
        return _profile(cfg, device, points, weights, total, available, limit, usable, progress)


def _profile(
    cfg, device, points, weights: int, total: int, available: int, limit: int, usable: int, progress: bool
) -> dict:
    if usable <= weights:
        raise ProfileError(
            f"usable memory {usable} bytes is not more than the model's weights ({weights} bytes)"
        )
    shapes = sorted(grid(cfg.max_tokens, cfg.block_length, cfg.canvas), key=lambda p: p.tokens)
    measured = []
    with tqdm(total=len(shapes) + 1, desc="profile", unit="shape", disable=not progress) as bar:
        for point in shapes:  # the bar ends its line even when a point fails, so an error prints alone
            measured.append(_measured(points.measure, point))
            logger.debug("%d x %d tokens: peak %d bytes", point.rows, point.width, measured[-1].peak_bytes)
            if problem := smallest_too_large(measured[0], usable):  # the smallest first: no grid in vain
                raise ProfileError(problem)
            bar.update(1)
        fit = _fit(measured, weights)
        budget, checks = _checked_budget(cfg, points.measure, fit, usable)
        bar.update(1)
    memory = {"total": total, "free": available, "limit": limit, "usable": usable, "weights": weights}
    return _result(cfg, device, memory, fit, budget, checks, measured) | {
        "points_measured_in": points.measured_in
    }


def _fit(points: list[Point], weights: int) -> MemoryFit:
    fitted = [p for p in points if not p.held_out]
    return fit_peak([p.tokens for p in fitted], [p.peak_bytes for p in fitted], weights)


def _checked_budget(
    cfg: ProfileConfig, measure: Callable[[Point], Point], fit: MemoryFit, usable: int
) -> tuple[int, list[dict]]:
    """The fit's budget, measured at its own size and scaled down until the measured peak fits."""
    budget, checks = fit.budget(usable), []
    for _ in range(MAX_CHECKS):
        if problem := no_block_fits(budget, cfg.block_length, fit, usable):
            raise ProfileError(problem)
        point = _measured(measure, check_shape(budget, cfg))
        checks.append(_check_record(budget, point, fit, usable))
        if point.peak_bytes <= usable:
            return budget, checks
        budget = _corrected_budget(budget, point.peak_bytes, fit.predict(0), usable)
    raise ProfileError(
        f"the measured peak at the budget stayed above usable memory ({usable} bytes) after {MAX_CHECKS} "
        "corrections (measured: "
        + ", ".join(f"{c['measured_bytes']} bytes at {c['tokens']} tokens" for c in checks)
        + ")"
    )


def _corrected_budget(budget: int, peak: int, fixed: float, usable: int) -> int:
    """The budget scaled so its variable part lands a margin under the limit: aiming exactly at the limit
    leaves a noisy peak just over it, check after check."""
    return int(budget * (usable - fixed) * (1 - CORRECTION_MARGIN) / max(peak - fixed, 1))


def _check_record(budget: int, point: Point, fit: MemoryFit, usable: int) -> dict:
    return {
        "budget": budget,
        "rows": point.rows,
        "width": point.width,
        "tokens": point.tokens,
        "measured_bytes": point.peak_bytes,
        "allocated_bytes": point.allocated_bytes,
        "predicted_bytes": int(fit.predict(point.tokens)),
        "under_limit": point.peak_bytes <= usable,
    }


def _weights_bytes(cfg: ProfileConfig) -> int:
    """Parameter bytes of rank 0's part (the most any rank holds; the whole for one process), from the
    config alone (no weights are loaded)."""
    config, _ = load_metadata(cfg.model, cfg.family)
    place = _place(cfg)
    parallel = TensorParallel(0, place.size, layout=place.layout)
    model = build_part(model_plan(config, parallel)).to(parse_dtype(cfg.dtype))
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _result(
    cfg: ProfileConfig, device, memory: dict, fit: MemoryFit, budget: int, checks: list[dict], points
) -> dict:
    largest_fitted = max(p.tokens for p in points if not p.held_out)
    extrapolation = Extrapolation.of(budget, largest_fitted, fit.r_squared)
    return {
        "model": cfg.model,
        "device": str(device),
        "device_name": device_name(device),
        "allocator": describe_allocator(str(device)),
        "torch_version": torch.__version__,
        "dtype": cfg.dtype,
        "layout": cfg.layout,
        "block_length": cfg.block_length,
        "steps": cfg.steps,
        "total_memory_bytes": memory["total"],
        "free_memory_bytes": memory["free"],
        "memory_limit_bytes": memory["limit"],
        "utilization": cfg.utilization,
        "usable_memory_bytes": memory["usable"],
        "weights_bytes": memory["weights"],
        "peak_measure": "reserved" if device.type == "cuda" else "resident",
        "cuda_alloc_conf": os.environ.get(CUDA_ALLOC_CONF, "") if device.type == "cuda" else None,
        "fit": {k: v for k, v in asdict(fit).items() if k != "weights_bytes"},
        "held_out": [_held_out_error(fit, p) for p in points if p.held_out],
        "points": [asdict(p) | {"tokens": p.tokens} for p in points],
        "budget_checks": checks,
        "extrapolation": extrapolation.as_json(),
        "warnings": extrapolation.warnings(),
        "token_budget": budget,
    } | cache_share(
        cfg.model, cfg.family, cfg.dtype, _place(cfg).layout.tensor, fit.bytes_per_token, cfg.sparse
    )


def _held_out_error(fit: MemoryFit, point: Point) -> dict:
    predicted = fit.predict(point.tokens)
    return {
        "rows": point.rows,
        "width": point.width,
        "tokens": point.tokens,
        "measured_bytes": point.peak_bytes,
        "predicted_bytes": int(predicted),
        "relative_error": round(abs(predicted - point.peak_bytes) / point.peak_bytes, 4),
    }
