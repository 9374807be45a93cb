"""How a profile measures one batch shape: a real block cycle on the model, its peak memory read. CUDA
points run in the profiling process between allocator peak resets; CPU points one after another in one
fresh process, each in a window of peak resident memory of its own (``device_memory.reset_peak``)."""

from __future__ import annotations

import gc
import random
from dataclasses import dataclass

from engine_pod.allocators import release_free_cpu_memory
from engine_pod.decoding.config import DecodingConfig
from engine_pod.device_memory import peak_allocated_bytes, resident_windows
from engine_pod.group_processes import ModelArgs, tensor_parallel_group
from engine_pod.isolation import ChildSession, run_in_child
from engine_pod.loading.loader import LoadedModel
from engine_pod.parallel.place import GroupPlace
from engine_pod.profiling.config import ProfileConfig
from engine_pod.profiling.grid import Point
from engine_pod.runner.factory import make_runner
from engine_pod.runner.tensor_parallel import group_peak, group_reset_peak
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput


def _rows_for(point: Point, loaded: LoadedModel, block_length: int, seed: int) -> list[CycleRow]:
    rng = random.Random(seed)
    special = {loaded.config.mask_token_id, *loaded.config.eos_token_ids}
    vocab = [t for t in range(min(loaded.config.vocab_size, 4096)) if t not in special]
    prefix = point.width - block_length
    return [CycleRow(tuple(rng.choice(vocab) for _ in range(prefix))) for _ in range(point.rows)]


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


def model_of(cfg: ProfileConfig):
    """The model (this process's rank of it) for as long as the context lasts."""
    args = ModelArgs(cfg.model, cfg.device, cfg.dtype, cfg.seed, cfg.family)
    return tensor_parallel_group(place_of(cfg), args)


def place_of(cfg: ProfileConfig) -> GroupPlace:
    return GroupPlace(cfg.tensor_parallel, expert=cfg.expert_parallel)


def measure_in_fresh_process(cfg: ProfileConfig, point: Point) -> Point:
    """One point in this process, the model loaded for it (``run_in_child`` gives it a fresh process)."""
    with model_of(cfg) as loaded:
        return measure_point(loaded, point, cfg)


def _measure_in_one_process(calls, answers, cfg: ProfileConfig) -> None:
    """CPU points one after another in this fresh process, each in a peak window of its own whose floor is
    the process's peak before the first (``device_memory.reset_peak``): what a fresh process reaches at
    that shape. Each answer: the point and whether its window was its own."""
    with model_of(cfg) as loaded:
        while (point := calls.get()) is not None:
            gc.collect()  # what the last point left in reference cycles goes before the next window,
            release_free_cpu_memory()  # and what the C heap keeps free of it is given back
            answers.put((measure_point(loaded, point, cfg), resident_windows()))


@dataclass(frozen=True)
class InProcessPoints:
    """CUDA points in this process, between allocator peak resets."""

    loaded: LoadedModel
    cfg: ProfileConfig
    measured_in: str = "this process"

    def measure(self, point: Point) -> Point:
        return measure_point(self.loaded, point, self.cfg)


class CpuPoints:
    """CPU points measured in one fresh process (the model loaded once); where the kernel does not let a
    process reset its peak, each point after the first in a fresh process of its own."""

    def __init__(self, cfg: ProfileConfig) -> None:
        self._cfg = cfg
        self._session: ChildSession | None = ChildSession(_measure_in_one_process, cfg)
        self.measured_in = "one fresh process"

    def __enter__(self) -> CpuPoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def measure(self, point: Point) -> Point:
        if self._session is None:
            return run_in_child(measure_in_fresh_process, self._cfg, point)
        measured, own_window = self._session.ask(point)
        if not own_window:  # the process's first point is its own all the same; the next would not be
            self._close()
            self.measured_in = "a fresh process each"
        return measured

    def _close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
