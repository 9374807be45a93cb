"""A generation request and its lifecycle states (no torch)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from dllm_contracts.request_params import GREEDY, RequestParams


class RequestState(enum.Enum):
    WAITING = "waiting"  # in the pending queue, never run
    RUNNING = "running"  # in the active set
    PREEMPTED = "preempted"  # back in the pending queue with its committed blocks kept
    FINISHED = "finished"  # done: EOS in a block, or its last block committed
    CANCELLED = "cancelled"  # withdrawn by the client


class FinishReason(enum.Enum):
    """Why a request ended: the status its done event carries, whoever ended it."""

    EOS = "stop"  # a committed block contained an end-of-sequence token
    LENGTH = "length"  # all K blocks were generated
    CANCELLED = "cancelled"  # withdrawn: the client left, or the batch it belonged to was cancelled
    ERROR = "error"  # refused: it can never run here, or its settings are invalid

    @property
    def ran_to_end(self) -> bool:
        """Generation ran to its end (its answer is cut to ``max_tokens``), not withdrawn or refused."""
        return self in (FinishReason.EOS, FinishReason.LENGTH)


class RequestError(ValueError):
    """A request that can never be served (empty prompt, too long for the budget, ...)."""


@dataclass
class Request:
    """One prompt to complete, generated block by block."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_blocks: int  # K = ceil(generation budget / L)
    arrival_time: float | None = None  # when it was enqueued (the scheduler's clock); set by add()
    state: RequestState = RequestState.WAITING
    generated: list[int] = field(default_factory=list)  # committed tokens, whole blocks
    finish_reason: FinishReason | None = None
    first_scheduled_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    params: RequestParams = GREEDY  # its settings as it was queued (max_blocks derives from max_tokens)
    in_batch: bool = False  # a batch line (the queue's batch lane), not an interactive request
    # block-diffusion models put blocks on the absolute grid: the prompt's last grid_head tokens share the
    # first block with the first generated tokens (from_tokens sets it; 0 for LLaDA and Dream)
    grid_head: int = 0
    on_grid: bool = False  # shaped by from_tokens for a model whose blocks sit on the absolute grid
    # keys of its whole blocks, for admission under a block prefix cache (scheduler/shared_blocks.py)
    block_keys: list[int] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise RequestError(f"request {self.request_id}: the prompt is empty")
        if self.max_blocks < 1:
            raise RequestError(f"request {self.request_id}: the generation budget must be at least one block")

    @classmethod
    def from_tokens(
        cls,
        request_id: str,
        prompt_ids,
        params: RequestParams,
        block_length: int,
        arrival_time: float | None = None,
        grid_aligned: bool = False,
    ):
        """The one place a token budget (``params.max_tokens``) becomes blocks. Off the grid:
        ``ceil(max_tokens / L)`` blocks after the prompt. On the absolute grid of ``L`` (block-diffusion
        models) the first block holds the prompt's tail: ``ceil((prompt + max_tokens) / L) - floor(prompt /
        L)`` blocks."""
        if params.max_tokens is None:
            raise RequestError(f"request {request_id}: its settings name no max_tokens")
        prompt = tuple(prompt_ids)
        head = len(prompt) % block_length if grid_aligned else 0
        blocks = math.ceil((head + params.max_tokens) / block_length)
        return cls(
            request_id, prompt, blocks, arrival_time, params=params, grid_head=head, on_grid=grid_aligned
        )

    @property
    def max_tokens(self) -> int | None:
        """The generation budget asked for (None: a request built from blocks)."""
        return self.params.max_tokens

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def blocks_done(self, block_length: int) -> int:
        return (self.grid_head + len(self.generated)) // block_length

    def prefix_len(self) -> int:
        """Tokens before the next block: prompt plus committed blocks (the queue's sort key)."""
        return self.prompt_len + len(self.generated)

    def next_width(self, block_length: int) -> int:
        """Row width p + (b+1) L of the next block cycle without a suffix (on the grid: the block's end)."""
        return self.prompt_len - self.grid_head + (self.blocks_done(block_length) + 1) * block_length

    def peak_width(self, block_length: int) -> int:
        """Widest this request's row can ever be: p + K L (on the grid: the last block's end)."""
        return self.prompt_len - self.grid_head + self.max_blocks * block_length

    @property
    def is_finished(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.CANCELLED)
