"""Offline peak-memory profiling: real block cycles over a grid of batch shapes -> a token budget.

Each grid point runs one block cycle (a refresh forward plus cached steps) on a batch of
``rows x width`` tokens. CUDA points run in this process between allocator peak resets; CPU points
each run in a child process so that its peak resident memory is that point's alone.
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from engine_pod.decoding.config import DecodingConfig
from engine_pod.isolation import ChildDied, run_in_child
from engine_pod.models.loader import (
    LoadedModel,
    build_model,
    load_metadata,
    load_model,
    parse_device,
    parse_dtype,
)
from engine_pod.profiling.fit import MemoryFit, fit_peak
from engine_pod.profiling.memory import peak_bytes, reset_peak, total_memory
from engine_pod.runner.block_cycle import BlockCycleRunner
from engine_pod.scheduler.cycle_row import CycleRow

logger = logging.getLogger(__name__)


class ProfileError(ValueError):
    """The profile cannot produce a usable budget (limit below the weights, grid too large, ...)."""


@dataclass(frozen=True)
class ProfileConfig:
    model: str
    device: str = "cpu"
    dtype: str = "float32"
    block_length: int = 32
    steps: int = 4  # denoising steps per profiled block cycle (peak is reached by the first cached step)
    memory_limit: int | None = None  # memory the engine may have; default: the device's total
    utilization: float = 0.9  # share of it to plan for
    max_tokens: int = 16384  # largest batch (rows x width) on the grid
    seed: int = 0


@dataclass(frozen=True)
class Point:
    rows: int
    width: int
    peak_bytes: int = 0
    held_out: bool = False

    @property
    def tokens(self) -> int:
        return self.rows * self.width


def grid(max_tokens: int, block_length: int) -> list[Point]:
    """Fit shapes spanning narrow-and-tall to wide-and-short batches, plus two held-out shapes."""
    widths = [w for w in (2 * block_length, 256, 1024) if w >= 2 * block_length]
    shapes = {(max(1, max_tokens // (f * w)), w) for w in sorted(set(widths)) for f in (1, 4, 16)}
    fit = [Point(r, w) for r, w in sorted(shapes) if r * w <= max_tokens and r * w >= 4 * block_length]
    held = [
        Point(max(1, max_tokens // (3 * 192)), 192, held_out=True),
        Point(max(1, max_tokens // (2 * 384)), 384, held_out=True),
    ]
    return fit + held


def _rows_for(point: Point, loaded: LoadedModel, block_length: int, seed: int) -> list[CycleRow]:
    rng = random.Random(seed)
    special = {loaded.config.mask_token_id, *loaded.config.eos_token_ids}
    vocab = [t for t in range(min(loaded.config.vocab_size, 4096)) if t not in special]
    prefix = point.width - block_length
    return [CycleRow(tuple(rng.choice(vocab) for _ in range(prefix))) for _ in range(point.rows)]


def measure_point(loaded: LoadedModel, point: Point, cfg: ProfileConfig) -> int:
    """Peak bytes of one real block cycle at this shape (low-confidence quota: exactly cfg.steps forwards)."""
    decoding = DecodingConfig(
        block_length=cfg.block_length, steps_per_block=cfg.steps, remasking="low_confidence"
    )
    runner = BlockCycleRunner(loaded, decoding)
    rows = _rows_for(point, loaded, cfg.block_length, cfg.seed)
    reset_peak(loaded.device)
    runner.run(rows, gather_rows=False)
    return peak_bytes(loaded.device)


def _measure_fresh(cfg: ProfileConfig, point: Point) -> int:
    loaded = load_model(cfg.model, cfg.device, cfg.dtype, seed=cfg.seed)
    return measure_point(loaded, point, cfg)


def _measure_in_child(cfg: ProfileConfig, point: Point) -> int:
    try:
        return run_in_child(_measure_fresh, cfg, point)
    except ChildDied as exc:
        raise ProfileError(
            f"profiling {point.rows}x{point.width} tokens failed ({exc}); the grid does not fit this device: "
            "lower --max-tokens"
        ) from None


def run_profile(cfg: ProfileConfig, progress: bool = True) -> dict:
    device = parse_device(cfg.device)
    total = total_memory(device)
    usable = int((cfg.memory_limit if cfg.memory_limit is not None else total) * cfg.utilization)
    loaded = load_model(cfg.model, cfg.device, cfg.dtype, seed=cfg.seed) if device.type == "cuda" else None
    weights = loaded.weights_bytes if loaded else _weights_bytes(cfg)
    if usable <= weights:
        raise ProfileError(
            f"usable memory {usable} bytes is not more than the model's weights ({weights} bytes)"
        )
    shapes, measured = grid(cfg.max_tokens, cfg.block_length), []
    with tqdm(total=len(shapes), desc="profile", unit="shape", disable=not progress) as bar:
        for point in shapes:  # the bar ends its line even when a point fails, so an error prints alone
            peak = measure_point(loaded, point, cfg) if loaded else _measure_in_child(cfg, point)
            measured.append(Point(point.rows, point.width, peak, point.held_out))
            logger.debug("%d x %d tokens: peak %d bytes", point.rows, point.width, peak)
            bar.update(1)
    return _result(cfg, device, total, usable, weights, measured)


def _weights_bytes(cfg: ProfileConfig) -> int:
    """Parameter bytes, from the config alone (no weights are loaded)."""
    config, _ = load_metadata(cfg.model)
    model = build_model(config, torch.device("meta"), parse_dtype(cfg.dtype))
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _result(cfg: ProfileConfig, device, total: int, usable: int, weights: int, points: list[Point]) -> dict:
    fitted = [p for p in points if not p.held_out]
    fit = fit_peak([p.tokens for p in fitted], [p.peak_bytes for p in fitted], weights)
    budget = fit.budget(usable)
    if budget < 2 * cfg.block_length:
        raise ProfileError(
            f"usable memory {usable} bytes leaves room for only {max(budget, 0)} batch tokens "
            f"(runtime {int(fit.intercept_bytes)} + weights {weights} bytes); that cannot run one block"
        )
    held_out = [_held_out_error(fit, p) for p in points if p.held_out]
    return {
        "model": cfg.model,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": cfg.dtype,
        "block_length": cfg.block_length,
        "steps": cfg.steps,
        "total_memory_bytes": total,
        "memory_limit_bytes": cfg.memory_limit if cfg.memory_limit is not None else total,
        "utilization": cfg.utilization,
        "usable_memory_bytes": usable,
        "weights_bytes": weights,
        "fit": {k: v for k, v in asdict(fit).items() if k != "weights_bytes"},
        "held_out": held_out,
        "points": [asdict(p) | {"tokens": p.tokens} for p in points],
        "token_budget": budget,
    }


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


def compact(result: dict) -> dict:
    """What fits in a Kubernetes termination message (< 4096 bytes)."""
    return {
        "token_budget": result["token_budget"],
        "device": result["device"],
        "device_name": result["device_name"],
        "dtype": result["dtype"],
        "usable_memory_bytes": result["usable_memory_bytes"],
        "weights_bytes": result["weights_bytes"],
        "bytes_per_token": round(result["fit"]["bytes_per_token"], 1),
        "intercept_bytes": int(result["fit"]["intercept_bytes"]),
        "r_squared": round(result["fit"]["r_squared"], 5),
        "held_out_max_error": max((h["relative_error"] for h in result["held_out"]), default=None),
    }
