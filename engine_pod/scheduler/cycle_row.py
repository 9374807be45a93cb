"""What the scheduler asks the runner to compute for one request in one block cycle (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_contracts.request_params import GREEDY, RequestParams


@dataclass(frozen=True)
class CycleRow:
    """One row of the dense batch: a request's canvas for this block cycle."""

    prefix_ids: tuple[int, ...]  # prompt followed by the blocks committed so far
    suffix_blocks: int = 0  # fully masked future blocks materialised after the active block
    suffix_visible: bool = False  # whether attention sees that suffix (Fast-dLLM canvas) or not
    active: bool = True  # False: the row is computed (a static batch's finished row) but never committed
    owner: str = ""  # the request behind the row: a runner with a persistent KV cache keys its pages on it
    # the request's settings, as it was queued (its threshold, sampling, log probabilities, generation
    # budget, its family's settings): the runner reads them here
    params: RequestParams = GREEDY
    prompt_len: int = 0  # where its answer starts in ``prefix_ids`` (read where it has a grammar)
    # > 0: a chunk row (scheduler/prefill_chunks.py): compute the keys and values of ``prefix_ids`` up to
    # here (whole blocks), decode nothing, commit nothing
    prefill_to: int = 0
    # (pieces done, pieces) where a dual-cache row's refresh is split across cycles (scheduler/split_refresh.py;
    # (0, 0): computed whole): done < pieces, the cycle computes the next piece of its layers and the row
    # commits nothing; done == pieces, the row decodes its block over the cache its pieces computed
    refresh_split: tuple[int, int] = (0, 0)

    @property
    def width(self) -> int:
        """Tokens this row occupies, without the block length (added by the runner)."""
        return len(self.prefix_ids)
