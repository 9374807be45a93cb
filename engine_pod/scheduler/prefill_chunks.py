"""Chunked prefill (no torch): a long prompt's keys and values computed a chunk at a time, one chunk per
block cycle, each chunk a row of that cycle beside the decoding rows, so that no cycle's first forward
carries a whole long prompt and stalls every decoding row with it.

A request whose prompt (up to its first block, on the absolute grid) has more than one chunk left to
compute gets a chunk row: ``CycleRow.prefill_to`` names the end of the prefix whose keys and values the
cycle computes (a multiple of the block length), and the row commits nothing. Its last chunk goes with its
first block's first forward, as an unchunked prompt's whole prefix does: the first block starts when the
last chunk is in the cache. Only a runner with an exact cache of final keys and values (block diffusion's
paged cache: LLaDA2.0, SDAR; DiffusionGemma's context cache, written by its causal encoder) chunks
(``Runner.chunks_prefill``); the scheduler asks it for nothing else.

Admission counts a chunk's forward cost as well as the pages its row holds: a chunking row is admitted
at its full width (the pages it holds once its prompt is in), and only while no other row's chunks are
running (``room_for``), so that a cycle's first forward computes at most one chunk beside the decoding
rows' blocks.
"""

from __future__ import annotations

from engine_pod.scheduler.request import Request

DEFAULT_PREFILL_CHUNK = (
    512  # tokens (rounded down to whole blocks): the chunk of vLLM's and SGLang's examples
)
BUDGET_SHARE = 8  # the default chunk is at most this share of the token budget


def prefill_chunk_tokens(setting: int | None, block_length: int, token_budget: int) -> int:
    """The chunk in tokens, whole blocks (0: no chunking): ``setting`` (None: the default, 512 tokens or an
    eighth of the budget, whichever is smaller, at least one block), rounded down to whole blocks."""
    if setting == 0:
        return 0
    wanted = setting if setting is not None else min(DEFAULT_PREFILL_CHUNK, token_budget // BUDGET_SHARE)
    return max(block_length, wanted // block_length * block_length)


class PrefillChunks:
    """How far each request's prompt is in the runner's cache, as this scheduler scheduled it."""

    def __init__(self, chunk: int, block_length: int) -> None:
        self.chunk, self.block_length = chunk, block_length
        self.done: dict[str, int] = {}  # request id -> prefix tokens whose keys and values are computed

    def chunk_end(self, request: Request) -> int:
        """The end of the chunk ``request``'s next row computes; 0: the row decodes its block (its prompt
        is in the cache, or what is left of it fits one chunk, computed with the block's first forward)."""
        if not self.chunk or request.generated:
            return 0
        target = request.prompt_len - request.grid_head  # the first block's start
        done = self.done.get(request.request_id, 0)
        return done + self.chunk if target - done > self.chunk else 0

    def chunks(self, request: Request) -> bool:
        """Whether ``request``'s prompt is computed in chunks. Its blocks then count as its own in the
        budget, never as shared: rows that enter while its chunks are computed find only those computed
        so far in the prefix cache, and a block it computes after another row cached it stays its own
        copy (kinds/block_causal/prefix_cache.py); counting them shared would overfill the pool."""
        return bool(self.chunk) and request.prompt_len - request.grid_head > self.chunk

    def cycle_tokens(self, requests: list[Request]) -> int:
        """Prompt tokens the next cycle's chunk rows compute (each row's next chunk)."""
        return sum(self.chunk_end(r) - self.done.get(r.request_id, 0) for r in requests if self.chunk_end(r))

    def room_for(self, request: Request, running: list[Request]) -> bool:
        """Whether ``request`` may be admitted beside ``running`` as far as the cycle's forward goes: a
        request whose prompt is chunked adds a chunk to every cycle's first forward until its prompt is in
        the cache, so it waits while another one's chunks are running: the decoding rows' forward carries
        at most one chunk (the chunk size is the one budget of prompt tokens a cycle computes beside
        them), however many long prompts arrive together. A prompt short enough to go whole is not held."""
        if not self.chunks(request):
            return True
        return self.cycle_tokens(running) == 0

    def ran(self, request_id: str, chunk_end: int) -> None:
        """A cycle computed ``request_id``'s prefix up to ``chunk_end``."""
        self.done[request_id] = chunk_end

    def forget(self, request_id: str) -> None:
        """The runner let go of the request's cache (finished, withdrawn, preempted): start again."""
        self.done.pop(request_id, None)
