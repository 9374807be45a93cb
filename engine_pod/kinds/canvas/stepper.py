"""DiffusionGemma's stepper, run by the cycle driver (runner/cycle_driver.py): a block cycle is one canvas
per row.

The scheduler's block is the model's canvas (``decoding.block_length`` must be its ``canvas_length``). A
cycle encodes each row's context tokens not encoded yet (the prompt at first, then the canvas committed
last cycle) into the request's context cache, draws each row's uniform canvas from the request's
generator, and denoises every row in one batched decoder forward per step; each row stops by its own
adaptive stopping (``decoding/entropy_bound.py``) and, when the cycle gathers rows, leaves the later
forwards. A row commits its last step's argmax canvas. A chunk row (``CycleRow.prefill_to``: a long prompt
encoded a chunk per cycle, ``prefill_chunk.py``) encodes its prompt up to its chunk's end in the same
encoder forward, and draws and commits nothing.

What the host and the device exchange in a cycle: one copy for the encoder's forward (its rows' chunks,
of any lengths, packed into one forward with their positions, slots and attention layout), one for the
decoder's batch (its layout, the rows' sampler settings), and one read per denoising step (each row's
done flag and argmax canvas, what its draws need to finish). The rows that go on when others stop are
picked out of the batch on the device (``ContextRows.rows``), so a cycle costs the same copies whatever
its rows' lengths and however they stop.

Kept per request between its cycles: its context cache (``context_cache.py``:
its context's keys and values in pages of the runner's pool, every context token in every layer; a
sliding layer reads the last window - 1), its ``torch.Generator`` (seeded with its ``RequestParams.seed``,
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
``dllm generate --entropy-bound`` and others set a request's): ``request_defaults``, an instance of the
settings the family declares (its record's ``request_params``). A row whose request set its own
(``CycleRow.params.family``: the API's request fields) samples with those, batched with rows that did
not. ``IGNORED`` lists what is ignored and why; a masked suffix (``--canvas full``), a block length other
than the canvas, a trace and margins are refused by name."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from engine_pod.decoding.config import DecodingConfig, DecodingConfigError
from engine_pod.decoding.entropy_bound import (
    CanvasSamplerState,
    SamplerColumns,
    entropy_bound_step,
    start_canvas,
)
from engine_pod.decoding.grammar.setup import GrammarSource
from engine_pod.kinds.canvas import grammar as grammar_hooks
from engine_pod.kinds.canvas.context_cache import (
    ContextCache,
    ContextRows,
    context_pool,
    context_regions,
)
from engine_pod.kinds.canvas.encode_rounds import encode_pending
from engine_pod.kinds.canvas.forward import CanvasForward
from engine_pod.kinds.canvas.prefill_chunk import CanvasChunks
from engine_pod.kinds.canvas.request_state import CanvasRequest
from engine_pod.runner.contract import CycleOutput, CycleStats
from engine_pod.runner.model_interface import ServedModel
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
class _CanvasCycle:
    """One cycle's state between its steps."""

    blocks: list[list[int] | None]  # per row: its committed canvas (padding until it stops; chunk rows None)
    steps: list[int]
    stats: CycleStats
    running: list[int] = field(default_factory=list)  # the rows still sampled
    rows: CanvasSamplerState | None = None  # their canvases and sampler state
    forward: CanvasForward | None = None
    limit: int = 0  # the most steps a row's canvas takes
    grammar: object | None = None  # its constrained rows (decoding/grammar/rows.py; None: none)
    chunks: CanvasChunks = field(default_factory=CanvasChunks)  # its chunk rows (prefill_chunk.py)


class CanvasStepper:
    """The canvas kind's part of a block cycle (DiffusionGemma's) (a ``Stepper`` of runner/cycle_driver.py)."""

    grid_aligned = False  # canvases follow the prompt, wherever it ends
    shares_blocks = False
    staggers_refreshes = False  # an exact context cache: nothing to refresh
    prefix_cache_stats = None
    chunks_prefill = True  # the encoder's keys and values are final: a long context encodes a chunk a cycle

    def __init__(self, loaded: ServedModel, decoding: DecodingConfig, pool_tokens: int | None = None) -> None:
        config = loaded.config
        if decoding.block_length != config.canvas_length:
            raise DecodingConfigError(
                f"block_length {decoding.block_length} is not the model's canvas_length "
                f"{config.canvas_length}: {loaded.family.display_name} denoises whole canvases"
            )
        if decoding.masked_suffix:
            raise DecodingConfigError(
                f"canvas 'full' (a masked suffix) does not apply: {loaded.family.display_name} has no masks"
            )
        if loaded.family.request_params is None:  # its sampler's settings (decoding/entropy_bound.py's names)
            raise DecodingConfigError(
                f"{loaded.family.display_name} declares no sampler settings (its record's request_params)"
            )
        self.loaded, self.decoding, self.model = loaded, decoding, loaded.model
        # the service's: its checkpoint's generation config, its steps per canvas the engine's
        self.request_defaults = loaded.family.service_settings(config, decoding.steps_per_block)
        self.pool_tokens = pool_tokens or DEFAULT_POOL_TOKENS
        pages = -(-self.pool_tokens // decoding.block_length)  # a row's pages never exceed its tokens
        # this process's heads (a tensor-parallel rank's share)
        self.pool = context_pool(
            loaded.model.config, pages, decoding.block_length, loaded.dtype, loaded.device
        )
        # the rows' lists of each forward (encoder chunks, decoder batches), at fixed addresses
        per_row = dict.fromkeys([*SamplerColumns.host_named([]), "running_at"], pages)
        regions = context_regions(config, self.pool_tokens, pages) | {"tokens": self.pool_tokens}
        self.pool.buffers.reserve(per_row | regions)
        self.pad_id = config.pad_token_id or 0
        self.states: dict[str, CanvasRequest] = {}
        self.suspended: OrderedDict[str, tuple[torch.Tensor, list[int]]] = OrderedDict()
        self.grammars = GrammarSource(loaded)

    def begin(self, cycle: SchedulerOutput) -> _CanvasCycle:
        """Released requests give their pages back; every computed row's pending context is encoded (a
        chunk row's up to its chunk's end), and every other computed row's canvas drawn (the decoder's
        layout and the rows' sampler settings in one copy)."""
        self._release(cycle.released, set(cycle.preempted))
        self._check_budget(cycle.rows)
        rows = list(zip(cycle.request_ids, cycle.rows))
        computed = [i for i, (_, row) in enumerate(rows) if row.active or not cycle.gather_rows]
        states = {i: self._state(*rows[i]) for i in computed}
        chunks = CanvasChunks.of(cycle.rows, computed)
        ends = {i: chunks.end(cycle.rows[i]) for i in computed}
        new = {i: ends[i] - len(states[i].encoded) for i in computed}
        canvases = sum(1 for i in computed if i not in chunks.rows and cycle.rows[i].active)
        stats = CycleStats()
        chunk_tokens = sum(new[i] for i in chunks.rows)
        chunks.count(chunk_tokens, sum(new.values()), canvases * self.decoding.block_length, stats)
        encoded = encode_pending(
            self.model, self.pool.buffers, [(states[i], rows[i][1].prefix_ids[: ends[i]]) for i in computed]
        )
        canvases = {i: state for i, state in states.items() if i not in chunks.rows}
        return self._start(cycle, canvases, encoded, chunks, stats)

    def most_steps(self, state: _CanvasCycle) -> int:
        return state.limit

    def going_on(self, state: _CanvasCycle, step: int) -> bool:
        """Whether a row is still sampled (each step's read is its sampler's, in ``step``)."""
        return bool(state.running)

    def finish(self, state: _CanvasCycle) -> CycleOutput:
        grammar_hooks.add_cost(state.grammar, state.stats)
        return CycleOutput(blocks=state.blocks, steps=state.steps, stats=state.stats)

    def end(self, state: _CanvasCycle) -> None:
        """Nothing: the requests' contexts are kept for their next cycle."""

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
        generator = torch.Generator(device=device).manual_seed(row.params.seed)
        state = CanvasRequest(generator, ContextCache(self.pool, owner, self.model.config))
        if owner in self.suspended:
            generator_state, state.chunks = self.suspended.pop(owner)
            state.generator.set_state(generator_state)
        self.states[owner] = state
        return state

    def _start(
        self,
        cycle: SchedulerOutput,
        states: dict[int, CanvasRequest],
        encoded: int,
        chunks: CanvasChunks,
        stats: CycleStats,
    ) -> _CanvasCycle:
        """Every computed row's canvas (``states``: the rows that are no chunk rows), to be stepped
        together until each stops; rows that stopped leave the forwards when the cycle gathers rows. The
        host sends the batch's layout and the rows' sampler settings in one copy. A chunk row commits
        nothing (None)."""
        L, R = self.decoding.block_length, len(cycle.rows)
        stats.computed_positions = stats.useful_positions = encoded
        blocks = [None if i in chunks.rows else [self.pad_id] * L for i in range(R)]
        state = _CanvasCycle(blocks, [0] * R, stats, chunks=chunks)
        computed = list(states)
        running = [i for i in computed if cycle.rows[i].active]  # the rows sampled
        if not running:
            return state
        params = [self.request_defaults.for_request(cycle.rows[i].params.family) for i in running]
        places = {row: place for place, row in enumerate(computed)}
        batch = ContextRows.of(
            [states[i].cache for i in computed],
            L,
            SamplerColumns.host_named(params) | {"running_at": [places[i] for i in running]},
            buffers=self.pool.buffers,
        )
        columns, running_at = SamplerColumns.of_sent(batch.extra), batch.extra["running_at"]
        state.rows = start_canvas(
            columns,
            [states[i].generator for i in running],
            L,
            self.model.config.vocab_size,
            batch.pool.device,
        )
        state.forward = CanvasForward(self.model, batch, running_at, cycle.gather_rows)
        state.running, state.limit = running, max(p.max_denoising_steps for p in params) + 1
        state.grammar = self.grammars.rows(cycle.rows, [[None] * L for _ in cycle.rows], batch.pool.device)
        state.limit = grammar_hooks.most_steps(state.limit, state.grammar, L)
        return state

    def step(self, state: _CanvasCycle, step: int) -> None:
        """One decoder forward of the running rows, their sampler's step (its one read) and the rows that
        stopped leaving."""
        L, forward, running = self.decoding.block_length, state.forward, state.running
        grammar = grammar_hooks.send_canvas_grammar(state.grammar, running)
        logits = forward.logits(state.rows.canvas if grammar is None else grammar.freeze(state.rows.canvas))
        state.stats.forwards += 1
        state.stats.computed_positions += forward.rows * L
        state.stats.useful_positions += len(running) * L
        result = entropy_bound_step(state.rows, logits, grammar)
        if step == 0:
            state.chunks.first_step_read(state.stats)
        grammar_hooks.walk(state.grammar, running, result)
        for place, i in enumerate(running):
            state.steps[i] += 1
            if result.done_rows[place]:
                state.blocks[i] = grammar_hooks.committed(state.grammar, i, result.committed[place])
        keep = [place for place, stopped in enumerate(result.done_rows) if not stopped]
        if keep:
            processed, probabilities = result.processed_logits, result.probabilities
            if len(keep) < len(running):  # the rows going on, picked out on the device
                index = torch.argsort(result.done.to(torch.int8), stable=True)[: len(keep)]
                processed, probabilities = processed[index], probabilities[index]
                state.rows = state.rows.select(index, keep)
                forward.keep(keep, index)
            forward.condition(self.model.soft_embeddings(processed, probabilities))
        state.running = [running[place] for place in keep]

    def forget(self) -> None:
        """Let go of every request's state and pages (a benchmark's warm-up leaves nothing behind)."""
        for state in self.states.values():
            state.cache.release()
        self.states.clear()
        self.suspended.clear()

    def first_block_confidences(self, prompts: list[list[int]]) -> torch.Tensor:
        raise ValueError(
            f"threshold calibration does not apply to {self.loaded.family.display_name}: its sampler accepts "
            "by entropy"
        )
