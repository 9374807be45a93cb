"""Offline peak-memory profiling: real block cycles over a grid of batch shapes -> a token budget.

For a block-diffusion model (and DiffusionGemma, whose context lives in a pool too) the batch's tokens
are also the KV pool's: the pool is allocated for them before the peak is reset, so the budget counts
what a request holds (its context's KV pages and its active block or canvas).

Each grid point runs one block cycle (a refresh forward plus cached steps) on a batch of
``rows x width`` tokens (``points.py``: CUDA points in this process, recording the reserved peak
beside the allocated one; CPU points in one fresh process, each shape's peak resident memory as a fresh
engine process would reach it). The budget the fit gives is then measured once at its own size and
lowered until that peak fits.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, replace

import torch
from tqdm import tqdm

from dllm_contracts.defaults import DEFAULT_BLOCK_LENGTH
from engine_pod.allocators import CUDA_ALLOC_CONF, describe_allocator
from engine_pod.device_memory import available_memory, device_name, total_memory
from engine_pod.families.registry import family_of
from engine_pod.isolation import ChildDied
from engine_pod.loading.loader import load_metadata, parse_device, parse_dtype
from engine_pod.loading.sharded import build_part, model_plan
from engine_pod.parallel.group import TensorParallel
from engine_pod.profiling.cache_share import cache_share
from engine_pod.profiling.config import ProfileConfig
from engine_pod.profiling.extrapolation import Extrapolation
from engine_pod.profiling.fit import MemoryFit, fit_peak
from engine_pod.profiling.grid import Point, grid
from engine_pod.profiling.points import CpuPoints, InProcessPoints, model_of, place_of
from engine_pod.profiling.room import no_block_fits, smallest_too_large

logger = logging.getLogger(__name__)


class ProfileError(ValueError):
    """The profile cannot produce a usable budget (limit below the weights, grid too large, ...)."""


CHECK_WIDTH = 1024  # width of the batch that checks the budget (narrower when the budget is small)
MAX_CHECKS = 3  # measurements at the budget, each lowering it when its peak was over the limit
# after an overshoot, aim this share of the headroom below the limit (peaks are noisy)
CORRECTION_MARGIN = 0.03


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
            loaded = held.enter_context(model_of(cfg))
            points, weights = InProcessPoints(loaded, cfg), loaded.weights_bytes
        else:
            points, weights = held.enter_context(CpuPoints(cfg)), _weights_bytes(cfg)
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
    place = place_of(cfg)
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
        cfg.model, cfg.family, cfg.dtype, place_of(cfg).layout.tensor, fit.bytes_per_token, cfg.sparse
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
