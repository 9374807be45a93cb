"""The engine's runner for DiffusionGemma: a block cycle is one canvas per row.

The scheduler's block is the model's canvas (``decoding.block_length`` must be its ``canvas_length``). A
cycle encodes each row's context tokens not encoded yet (the prompt at first, then the canvas committed
last cycle) into the request's context cache, draws each row's uniform canvas from the request's
generator, and denoises every row in one batched decoder forward per step; each row stops by its own
adaptive stopping (``decoding/entropy_bound.py``) and, when the cycle gathers rows, leaves the later
forwards. A row commits its last step's argmax canvas.

Kept per request between its cycles: its context cache (``models/diffusion_gemma/context_cache.py``:
its context's keys and values in pages of the runner's pool, every context token in every layer; a
sliding layer reads the last window - 1), its ``torch.Generator`` (seeded with its ``SamplingParams.seed``,
0 without one, so its first canvas is the reference's after ``torch.manual_seed(seed)``) and the lengths
of the encoder forwards that wrote the cache. Between two steps a row carries its canvas [L] and soft
embeddings [L, D], never [L, V] logits. A request that ``cycle.released`` names (finished, cancelled or
preempted) gives its pages back (oldest first, the pool's free order) and is forgotten, but a preempted
one keeps its generator's state and those lengths: at its return its cache is re-encoded chunk by chunk
as it was first written, so it continues with the tokens it would have had. A takeover by another
worker loses the generator's state (the new worker seeds a fresh one, so later canvases draw other noise:
a valid sample, not the one an uninterrupted run gives) and the chunking (the context is encoded in one
forward: the same keys up to rounding).

The pool holds the token budget (``pool_tokens``) in pages of one canvas. The scheduler charges a row its
context and its canvas; the row's pages hold its context, rounded up to whole pages, which is never more
than that charge, so a cycle within the budget never runs short of pages. A cycle whose rows' contexts
and canvases exceed the budget is refused.

What the family honours of the engine's options: ``block_length`` (= the canvas), ``steps_per_block``
(the sampler's ``max_denoising_steps`` per canvas), ``ignore_eos`` (the scheduler's) and the layouts
(queries are whole canvases either way; packed and dense differ in the scheduler's cost only). The
sampler's other settings come from the checkpoint's generation config (``DiffusionGemmaConfig.generation``,
``dllm generate --entropy-bound`` and others override them): ``canvas_sampler``. A row whose request set
its own (``CycleRow.sampler``: the API's request fields) samples with those, batched with rows that did
not. ``IGNORED`` lists what is ignored and why; ``canvas="full"``, a block length other than the canvas,
a trace and margins are refused by name.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from engine_pod.decoding.config import DecodingConfig, DecodingConfigError
from engine_pod.decoding.entropy_bound import EntropyBoundParams, denoise_step, start_canvas
from engine_pod.models.diffusion_gemma.context_cache import ContextBatch, ContextCache, context_pool
from engine_pod.models.loader import LoadedModel
from engine_pod.runner.contract import CycleOutput, CycleStats
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput

DEFAULT_POOL_TOKENS = 1 << 16
MAX_SUSPENDED = 4096  # preempted requests' generator states kept (the oldest dropped beyond)
IGNORED = {  # engine options that mean nothing for this family
    "remasking, threshold, eps": "the entropy-bound sampler accepts by entropy (its generation config)",
    "cache": "the context's keys and values are always kept exactly, as the reference keeps them",
    "prefix_cache": "nothing is shared between requests",
    "a request's threshold, temperature, top_p, top_k": "the sampler's own schedule (t_min, t_max, ...)",
    "logprobs": "not recorded (None)",
}


@dataclass
class CanvasRequest:
    """What the runner keeps for one request between its cycles."""

    generator: torch.Generator
    cache: ContextCache  # its context's keys and values, in pages of the runner's pool
    chunks: list[int] = field(default_factory=list)  # tokens of each encoder forward, in order
    encoded: tuple[int, ...] = ()  # the context tokens the cache holds

    def pending(self, prefix: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The chunks to encode before this cycle's canvas: a rebuild's as first written (a new request
        has none), then the rest."""
        chunks, start = [], len(self.encoded)
        if not self.encoded:
            for length in self.chunks:
                chunks.append(prefix[start : start + length])
                start += length
        return chunks + ([prefix[start:]] if len(prefix) > start else [])


class CanvasCycleRunner:
    """The Runner contract for DiffusionGemma."""

    grid_aligned = False  # canvases follow the prompt, wherever it ends
    shares_blocks = False
    prefix_cache_stats = None

    def __init__(self, loaded: LoadedModel, decoding: DecodingConfig, pool_tokens: int | None = None) -> None:
        config = loaded.config
        if decoding.block_length != config.canvas_length:
            raise DecodingConfigError(
                f"block_length {decoding.block_length} is not the model's canvas_length "
                f"{config.canvas_length}: DiffusionGemma denoises whole canvases"
            )
        if decoding.canvas != "block":
            raise DecodingConfigError(
                f"canvas {decoding.canvas!r} does not apply: DiffusionGemma has no masks"
            )
        self.loaded, self.decoding, self.model = loaded, decoding, loaded.model
        self.canvas_sampler = EntropyBoundParams.for_service(config.generation, decoding.steps_per_block)
        self.pool_tokens = pool_tokens or DEFAULT_POOL_TOKENS
        pages = -(-self.pool_tokens // decoding.block_length)  # a row's pages never exceed its tokens
        self.pool = context_pool(config, pages, decoding.block_length, loaded.dtype, loaded.device)
        self.pad_id = config.pad_token_id or 0
        self.states: dict[str, CanvasRequest] = {}
        self.suspended: OrderedDict[str, tuple[torch.Tensor, list[int]]] = OrderedDict()

    def run(self, cycle: SchedulerOutput) -> CycleOutput:
        if not cycle.rows:
            raise ValueError("a block cycle needs at least one row")
        self._release(cycle.released, set(cycle.preempted))
        self._check_budget(cycle.rows)
        rows = list(zip(cycle.request_ids, cycle.rows))
        computed = [i for i, (_, row) in enumerate(rows) if row.active or not cycle.gather_rows]
        states = {i: self._state(*rows[i]) for i in computed}
        encoded = self._encode([(states[i], rows[i][1].prefix_ids) for i in computed])
        return self._denoise(cycle, states, encoded)

    def _release(self, released: list[str], preempted: set[str]) -> None:
        """Released requests give their pages back, oldest first (the pool's free order); a preempted
        one keeps its generator's state and chunk lengths."""
        gone = set(released)
        for owner in [owner for owner in self.states if owner in gone]:
            state = self.states.pop(owner)
            state.cache.release()
            if owner in preempted:
                self.suspended[owner] = (state.generator.get_state(), state.chunks)
                while len(self.suspended) > MAX_SUSPENDED:
                    self.suspended.popitem(last=False)

    def _check_budget(self, rows: list[CycleRow]) -> None:
        held = sum(row.width + self.decoding.block_length for row in rows)
        if held > self.pool_tokens:
            raise ValueError(
                f"the cycle's rows hold {held} context and canvas tokens, more than the pool's "
                f"{self.pool_tokens} (the token budget)"
            )

    def _state(self, owner: str, row: CycleRow) -> CanvasRequest:
        state = self.states.get(owner)
        if state is not None and row.prefix_ids[: len(state.encoded)] == state.encoded:
            return state
        if state is not None:  # its context is not this row's (a static batch's finished row)
            state.cache.release()
        device = self.loaded.device
        seed = row.sampling.seed if row.sampling is not None else 0
        generator = torch.Generator(device=device).manual_seed(seed)
        state = CanvasRequest(generator, ContextCache(self.pool, owner, self.model.config))
        if owner in self.suspended:
            generator_state, state.chunks = self.suspended.pop(owner)
            state.generator.set_state(generator_state)
        self.states[owner] = state
        return state

    def _encode(self, work: list[tuple[CanvasRequest, tuple[int, ...]]]) -> int:
        """Encode every request's pending chunks, each request's in order; the chunks of one round and of
        one length go through the encoder together. Returns the tokens encoded."""
        queues = [(state, state.pending(prefix)) for state, prefix in work]
        for state, _ in queues:
            if not state.encoded:
                state.chunks = []  # recorded again as they are encoded
        encoded, round_ = 0, 0
        while any(round_ < len(chunks) for _, chunks in queues):
            by_length: dict[int, list[tuple[CanvasRequest, tuple[int, ...]]]] = {}
            for state, chunks in queues:
                if round_ < len(chunks):
                    by_length.setdefault(len(chunks[round_]), []).append((state, chunks[round_]))
            for length, group in by_length.items():
                ids = torch.tensor([chunk for _, chunk in group], device=self.loaded.device)
                self.model.encode(ids, [state.cache for state, _ in group])
                for state, chunk in group:
                    state.encoded += chunk
                    state.chunks.append(length)
                encoded += length * len(group)
            round_ += 1
        return encoded

    def _denoise(self, cycle: SchedulerOutput, states: dict[int, CanvasRequest], encoded: int) -> CycleOutput:
        """Every computed row's canvas, stepped together until each stops; rows that stopped leave the
        forwards when the cycle gathers rows."""
        L, R = self.decoding.block_length, len(cycle.rows)
        device, config = self.loaded.device, self.model.config
        sampled = [i for i in states if cycle.rows[i].active]
        blocks = [[self.pad_id] * L for _ in range(R)]
        steps = [0] * R
        stats = CycleStats(computed_positions=encoded, useful_positions=encoded)
        canvas = torch.full((R, L), self.pad_id, dtype=torch.int64, device=device)
        running, soft = sampled, None
        if sampled:
            generators = [states[i].generator for i in sampled]
            params = [cycle.rows[i].sampler or self.canvas_sampler for i in sampled]
            rows = start_canvas(params, generators, L, config.vocab_size, device)
            canvas[sampled] = rows.canvas
        laid_out, contexts = None, None  # the forward's rows' contexts, laid out once for their steps
        while running:
            forward = running if cycle.gather_rows else list(states)
            if forward != laid_out:
                laid_out, contexts = forward, ContextBatch([states[i].cache for i in forward])
            logits = self.model.denoise(canvas[forward], contexts, None if soft is None else soft[forward])
            stats.forwards += 1
            stats.computed_positions += len(forward) * L
            stats.useful_positions += len(running) * L
            if forward != running:  # a static batch's rows that stopped are computed, not sampled
                at = {row: place for place, row in enumerate(forward)}
                logits = logits[[at[i] for i in running]]
            result = denoise_step(rows, logits)
            done = result.done.tolist()
            for place, i in enumerate(running):
                steps[i] += 1
                if done[place]:
                    blocks[i] = result.argmax[place].tolist()
            keep = [place for place, stopped in enumerate(done) if not stopped]
            if keep:
                if soft is None:
                    soft = torch.zeros(R, L, config.hidden_size, dtype=self.loaded.dtype, device=device)
                going = [running[place] for place in keep]
                processed, probabilities = result.processed_logits, result.probabilities
                if len(keep) < len(running):  # copies of the rows going on only when some stopped
                    processed, probabilities, rows = processed[keep], probabilities[keep], rows.select(keep)
                soft[going] = self.model.soft_embeddings(processed, probabilities)
                canvas[going] = rows.canvas
            running = [running[place] for place in keep]
        return CycleOutput(blocks=blocks, steps=steps, stats=stats)

    def forget(self) -> None:
        """Let go of every request's state and pages (a benchmark's warm-up leaves nothing behind)."""
        for state in self.states.values():
            state.cache.release()
        self.states.clear()
        self.suspended.clear()

    def first_block_confidences(self, prompts: list[list[int]]) -> torch.Tensor:
        raise ValueError(
            "threshold calibration does not apply to diffusion_gemma: its sampler accepts by entropy"
        )
