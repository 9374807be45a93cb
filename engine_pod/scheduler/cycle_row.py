"""What the scheduler asks the runner to compute for one request in one block cycle (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_contracts.canvas_sampler import EntropyBoundParams
from dllm_contracts.structured_output import ResponseGrammar
from engine_pod.decoding.sampling_params import SamplingParams


@dataclass(frozen=True)
class CycleRow:
    """One row of the dense batch: a request's canvas for this block cycle."""

    prefix_ids: tuple[int, ...]  # prompt followed by the blocks committed so far
    suffix_blocks: int = 0  # fully masked future blocks materialised after the active block
    suffix_visible: bool = False  # whether attention sees that suffix (Fast-dLLM canvas) or not
    active: bool = True  # False: the row is computed (a static batch's finished row) but never committed
    threshold: float | None = None  # this request's confidence threshold, if it overrides the engine's
    sampling: SamplingParams | None = None  # None: greedy
    sampler: EntropyBoundParams | None = None  # the entropy-bound sampler's (DiffusionGemma); None: runner's
    logprobs: int | None = None  # record each committed token's log probability and this many alternatives
    owner: str = ""  # the request behind the row: a runner with a persistent KV cache keys its pages on it
    max_tokens: int | None = (
        None  # the request's generation budget (a family whose reference caps its steps by it)
    )
    grammar: ResponseGrammar | None = None  # the grammar its answer is generated in (None: free)
    prompt_len: int = 0  # where its answer starts in ``prefix_ids`` (read where it has a grammar)
    # > 0: a chunk row (scheduler/prefill_chunks.py): compute the keys and values of ``prefix_ids`` up to
    # here (whole blocks), decode nothing, commit nothing
    prefill_to: int = 0

    @property
    def width(self) -> int:
        """Tokens this row occupies, without the block length (added by the runner)."""
        return len(self.prefix_ids)
