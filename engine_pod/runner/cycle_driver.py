"""The engine's one cycle driver: every family's block cycle is the same loop.

``begin`` lays the cycle out (its rows' layout in one copy to the device, their pages in the KV pool, new
context encoded where the family has an encoder); then, step by step, ``step`` runs one denoising step
(the step's forward batch, the model's forward, the commits) and ``going_on`` makes the step's one read
of the device (which rows go on: a row whose block is complete leaves the next forwards where the cycle
gathers rows), until no row goes on; ``finish`` reads the committed blocks, and ``end`` gives back what
the cycle held, however it ended.

What differs by the family's cache kind is the stepper, which the kind's folder holds (engine_pod/kinds/:
bidirectional, block_causal, canvas) and the family's record names (runner/kind.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from dllm_contracts.request_params import FamilyParams
from engine_pod.decoding.config import DecodingConfig
from engine_pod.logit_count import LOGITS
from engine_pod.runner.contract import CycleOutput, PrefixCacheStats
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.warm_prefixes import warm_prefix_problem

if TYPE_CHECKING:  # tensors: named here, never imported at run time
    from torch import Tensor

    from engine_pod.decoding.grammar.setup import GrammarSource
    from engine_pod.runner.model_interface import ServedModel


class Stepper(Protocol):
    """A cache kind's part of a block cycle; the driver runs the loop. A cycle's state is the stepper's own."""

    grid_aligned: bool
    shares_blocks: bool
    prefix_cache_stats: PrefixCacheStats | None
    request_defaults: FamilyParams | None
    staggers_refreshes: bool  # runs a cycle's refresh quota (dLLM-Serve's phases)

    def begin(self, cycle: SchedulerOutput) -> Any:
        """The cycle laid out: its state."""
        ...

    def most_steps(self, state: Any) -> int:
        """Steps within which every row's block completes (more: a bug)."""
        ...

    def going_on(self, state: Any, step: int) -> bool:
        """After ``step`` steps: whether a row steps again (the step's one read)."""
        ...

    def step(self, state: Any, step: int) -> None:
        """Denoising step ``step`` of the rows going on."""
        ...

    def finish(self, state: Any) -> CycleOutput:
        """The committed blocks, the rows' steps and the cycle's costs."""
        ...

    def end(self, state: Any) -> None:
        """Give back what the cycle held (run however the cycle ended)."""
        ...

    def forget(self) -> None: ...

    grammars: GrammarSource  # its constrained rows' grammar compiler

    def first_block_confidences(self, prompts: list[list[int]]) -> Tensor: ...


class CycleRunner:
    """The Runner contract (runner/contract.py) of every family: this loop over its cache kind's stepper."""

    def __init__(self, loaded: ServedModel, decoding: DecodingConfig, stepper: Stepper) -> None:
        self.loaded, self.decoding, self.stepper = loaded, decoding, stepper
        self.logit_budget = decoding.logit_budget

    def _arm(self) -> None:
        """The model's LM head materializes logits as this runner's decoding asks, and its products are
        row-invariant where it asks (several runners may share one model: each sets its own before it
        runs)."""
        self.loaded.model.logit_budget = self.logit_budget
        model, asked = self.loaded.model, self.decoding.batch_invariant
        if getattr(model, "batch_invariant", False) != asked:
            from engine_pod.models.batch_invariant import arm  # torch's side: the driver imports none

            arm(model, self.loaded.device, asked)

    @property
    def grid_aligned(self) -> bool:
        return self.stepper.grid_aligned

    @property
    def shares_blocks(self) -> bool:
        return self.stepper.shares_blocks

    @property
    def chunks_prefill(self) -> bool:
        """Whether a prompt's prefix may be computed a chunk at a time (scheduler/prefill_chunks.py)."""
        return getattr(self.stepper, "chunks_prefill", False)

    @property
    def refresh_layers(self) -> int:
        """Layers a dual-cache row's refresh may be split over across cycles (scheduler/split_refresh.py;
        0: every refresh is computed whole)."""
        return getattr(self.stepper, "refresh_layers", 0)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        return self.stepper.prefix_cache_stats

    @property
    def request_defaults(self) -> FamilyParams | None:
        return self.stepper.request_defaults

    @property
    def staggers_refreshes(self) -> bool:
        return self.stepper.staggers_refreshes

    def run(self, cycle: SchedulerOutput) -> CycleOutput:
        """One block cycle over the scheduler's rows."""
        if not cycle.rows:
            raise ValueError("a block cycle needs at least one row")
        if self.decoding.batch_invariant and not cycle.packed:
            # a dense box pads each row to its width, and the attention kernel blocks a row's queries and
            # keys by that width: under the setting every cycle's rows run packed, each over its own keys
            cycle = replace(cycle, packed=True)
        self._arm()
        mark = LOGITS.start()
        state = self.stepper.begin(cycle)
        try:
            limit, step = self.stepper.most_steps(state), 0
            while self.stepper.going_on(state, step):
                if step >= limit:
                    raise RuntimeError(f"a block did not complete within {limit} forwards; this is a bug")
                self.stepper.step(state, step)
                step += 1
            out = self.stepper.finish(state)
            out.stats.logits_materialized, out.stats.peak_logits = LOGITS.since(mark)
            return out
        finally:
            self.stepper.end(state)

    def forget(self) -> None:
        """Let go of every request's state kept across cycles."""
        self.stepper.forget()

    def keep_alive(self) -> None:
        """One process: no group to keep waiting."""

    def first_block_confidences(self, prompts: list[list[int]]) -> Tensor:
        self._arm()
        return self.stepper.first_block_confidences(prompts)

    def grammar_problem(self, grammar) -> str | None:
        return self.stepper.grammars.problem(grammar)

    def warm_prefix(self, tokens: list[int]) -> int:
        """Compute ``tokens``' whole blocks into the prefix cache and pin them (the paged stepper's); a
        family or decoding without an exact prefix cache is refused in one line."""
        family, decoding = self.loaded.family, self.decoding
        problem = warm_prefix_problem(
            family.display_name, family.kind.name, decoding.cache, decoding.prefix_cache
        )
        if problem is not None:
            raise ValueError(problem)
        self._arm()
        return self.stepper.warm_prefix(tokens)
