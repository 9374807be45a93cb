"""The runner contract every model family's runner keeps: the scheduler's output in, one block cycle's
committed tokens and costs out. Torch-free, so the engine, the worker and the scheduler's side can
name it without loading a model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dllm_contracts.request_params import FamilyParams
from dllm_contracts.structured_output import ResponseGrammar
from engine_pod.decoding.config import DecodingConfig
from engine_pod.scheduler.output import SchedulerOutput

if TYPE_CHECKING:  # the loaded model holds tensors: named here, never imported at run time
    from torch import Tensor

    from engine_pod.runner.model_interface import ServedModel


@dataclass
class PrefixCacheStats:
    """A runner's block prefix cache: running totals since it was made (a scrape turns them into counters)."""

    looked_up_tokens: int = 0  # whole-block tokens rows asked for when they entered the batch
    hit_tokens: int = 0  # of those, found cached
    attached_rows: int = 0
    evicted_tokens: int = 0
    cached_tokens: int = 0  # tokens the tree holds now
    pinned_tokens: int = 0  # of those, warmed prefixes' (never evicted)


@dataclass
class CycleStats:
    forwards: int = 0  # model forward calls
    computed_positions: int = 0  # query token positions pushed through the model
    useful_positions: int = 0  # of those, positions of live requests' prompts and blocks
    kv_dense_bytes: int = 0  # dual cache: keys and values of every cached position, every layer and head
    kv_kept_bytes: int = 0  # of those, what the cache holds (all of them, unless head-sparse)
    # rows that entered the batch this cycle: their tokens found in a prefix cache (runners that have one)
    cached_on_entry: dict[str, int] = field(default_factory=dict)
    # positions computed by refreshes (forwards that rewrite a dual cache), in all and in the cycle's largest
    refresh_positions: int = 0
    peak_refresh_positions: int = 0
    logits_materialized: int = 0  # LM head outputs computed: positions x columns (vocabulary or k)
    peak_logits: int = 0  # the most of them that existed at once (one chunk)
    # structured outputs: the host's grammar work (bitmasks computed and the seconds they took; the
    # seconds spent walking proposals, and the tokens that walk committed beyond the frontiers)
    grammar_masks: int = 0
    grammar_mask_seconds: float = 0.0
    grammar_walk_seconds: float = 0.0
    grammar_walk_commits: int = 0
    # chunked prefill (kinds/block_causal/prefill_chunk.py): chunk rows computed, their tokens, and the share
    # of the cycle's first forward they took while decoding rows waited on it (seconds)
    prefill_chunks: int = 0
    prefill_chunk_tokens: int = 0
    chunk_wait_s: float = 0.0

    def add_grammar(self, cost) -> None:
        """A cycle's grammar cost (decoding/grammar/rows.py ``GrammarCost``)."""
        self.grammar_masks += cost.masks
        self.grammar_mask_seconds += cost.mask_seconds
        self.grammar_walk_seconds += cost.advance_seconds
        self.grammar_walk_commits += cost.host_commits

    def add_refresh(self, positions: int) -> None:
        """A forward's refresh positions."""
        self.refresh_positions += positions
        self.peak_refresh_positions = max(self.peak_refresh_positions, positions)


@dataclass
class CycleOutput:
    blocks: list[list[int]]  # per row: the block's tokens as committed (mask id where left masked)
    steps: list[int]  # per row: forwards the row's block took
    stats: CycleStats
    margins: list[list[float]] | None = None  # per row and block position: top-1 minus top-2 probability
    # when the position was committed (inf if never), recorded on request to locate near-ties
    # per row asking for them (None for the others), per block position: (log p of the committed token,
    # [(alternative id, its log p), ...]) under the distribution of the step that committed it
    logprobs: list[list[tuple] | None] | None = None
    # per row, where the cycle ended at a step (step-level batching): True where its block is not complete
    # and goes on in the next cycle (its ``blocks`` entry is not committed); None: every block is complete
    carried: list[bool] | None = None


class Runner(Protocol):
    """Runs block cycles of one model with one decoding config."""

    loaded: ServedModel  # the model, its config (EOS ids) and tokenizer
    decoding: DecodingConfig
    grid_aligned: bool  # the model's blocks sit on the absolute grid of the block length
    shares_blocks: bool  # the runner shares rows' common whole blocks (a prefix cache)
    prefix_cache_stats: PrefixCacheStats | None  # its running totals (None: no prefix cache)
    # the service's values of the per-request settings its family adds (an instance of the family's
    # ``request_params``; a row's ``params.family`` replaces them); None: the family adds none, and a request
    # that sets any is refused
    request_defaults: FamilyParams | None
    staggers_refreshes: bool  # staggers a cycle's dual-cache refreshes under its quota (dLLM-Serve's phases)

    def run(self, cycle: SchedulerOutput) -> CycleOutput:
        """One block cycle over ``cycle.rows``: ``gather_rows`` drops rows whose block is complete from
        later forwards; ``packed`` computes only the positions that exist (else the dense box). A runner
        that keeps per-request state across cycles frees that of the requests ``cycle.released`` names."""
        ...

    def forget(self) -> None:
        """Let go of every request's state kept across cycles (a benchmark's warm-up leaves nothing)."""
        ...

    def keep_alive(self) -> None:
        """Called on each turn of an idle serving loop: rank 0 of a tensor-parallel group keeps its
        followers waiting (a pulse when one is due); one process has nothing to do."""
        ...

    def first_block_confidences(self, prompts: list[list[int]]) -> Tensor:
        """The remasking policy's confidence at every masked position of each prompt's first block, from
        its first forward (a threshold calibration samples them); nothing is kept."""
        ...

    def warm_prefix(self, tokens: list[int]) -> int:
        """Compute ``tokens``' whole blocks into the prefix cache and pin them there for good (a warm
        prefix); returns the tokens newly pinned. ValueError for a model without an exact prefix cache."""
        ...

    def grammar_problem(self, grammar: ResponseGrammar) -> str | None:
        """Why a request with ``grammar`` cannot run here (it does not compile for the model's tokenizer,
        the model has none, ...), in one line; None: it can (compiled now, kept for its cycles)."""
        ...


def scheduling_facts(runner: Runner) -> dict[str, bool | int]:
    """What a scheduler is built knowing about the runner's model (keyword arguments of every scheduler):
    whether its blocks sit on the absolute grid, whether the runner shares rows' common whole blocks."""
    return {
        "grid_aligned": runner.grid_aligned,
        "shares_blocks": runner.shares_blocks,
        "chunks_prefill": getattr(runner, "chunks_prefill", False),
        "refresh_layers": getattr(runner, "refresh_layers", 0),
    }
