"""What every scheduler shares: request intake, committing a block cycle's output, completion checks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from dllm_contracts.request_params import RequestParams
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.request import FinishReason, Request, RequestError, RequestState


@dataclass(frozen=True)
class ClaimPlan:
    """What a worker may read from the shared queue now: the shortest ``count`` pending requests with a
    prefix of at most ``max_prefix`` tokens, plus those waiting past the bound (any width); with
    ``oldest_first``, the ``count`` that have waited longest instead, whatever their widths."""

    count: int
    max_prefix: int
    oldest_first: bool = False


class Scheduler:
    """Base class: subclasses decide which rows run in the next block cycle (``schedule``) and, for a
    worker drawing from a shared queue, what to claim (``claim_plan``, ``choose``, ``unadmittable``)."""

    gather_rows = True  # rows whose block is complete leave the forwards early
    staggers_refreshes = False  # its cycles carry a refresh quota (dLLM-Serve): the runner must run it

    def __init__(
        self,
        block_length: int,
        eos_ids: Iterable[int],
        ignore_eos: bool = False,
        masked_suffix: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        grid_aligned: bool = False,
        shares_blocks: bool = False,
        chunks_prefill: bool = False,
        refresh_layers: int = 0,
    ) -> None:
        """``grid_aligned``: the model's blocks sit on the absolute grid of ``block_length`` (block-diffusion
        models); ``shares_blocks``: its runner shares rows' common whole blocks (a prefix cache). Both are
        the runner's facts (``Runner.grid_aligned``, ``Runner.shares_blocks``): the engine checks them."""
        self.block_length = block_length
        self.eos_ids = frozenset(eos_ids)
        self.ignore_eos = ignore_eos
        self.masked_suffix = masked_suffix  # rows hold their masked suffix (DecodingConfig's)
        self.clock = clock
        self.requests: dict[str, Request] = {}
        self.grid_aligned = grid_aligned
        self.shares_blocks = shares_blocks
        self.chunks_prefill = chunks_prefill  # the runner computes a prompt's prefix a chunk at a time
        self.refresh_layers = refresh_layers  # layers a row's refresh may be split over (0: never split)
        self._in_rows: list[str] = []  # the requests behind the last cycle's rows, in row order

    def row_width_of(self, row: CycleRow) -> int:
        """Tokens a row of the next cycle holds: its prefix, the active block and any suffix."""
        return len(row.prefix_ids) + self.block_length * (1 + row.suffix_blocks)

    def row_of(self, request: Request, prefill_to: int = 0) -> CycleRow:
        """The one place a running request becomes a cycle's row: its prompt and committed blocks, its masked
        suffix (the blocks after the active one) where attention sees it (Fast-dLLM's sequence; a hidden
        suffix would be computed and never read, so it is left out), and its settings as they were queued.
        ``prefill_to`` > 0: a chunk row (``prefill_chunks.py``), which decodes nothing, so it keeps to no
        grammar (its settings without one)."""
        blocks_left = request.max_blocks - request.blocks_done(self.block_length) - 1
        params = replace(request.params, grammar=None) if prefill_to else request.params
        return CycleRow(
            request.prompt_ids + tuple(request.generated),
            suffix_blocks=blocks_left if self.masked_suffix else 0,
            suffix_visible=True,
            owner=request.request_id,
            prompt_len=request.prompt_len,
            params=params,
            prefill_to=prefill_to,
        )

    # -- intake -------------------------------------------------------------------------------
    def request_for(
        self, request_id: str, prompt_ids, params: RequestParams, arrival_time: float | None = None
    ) -> Request:
        """A request with its settings, shaped for this scheduler's blocks (on the grid or not), ready for
        ``add``."""
        return Request.from_tokens(
            request_id, prompt_ids, params, self.block_length, arrival_time, self.grid_aligned
        )

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise RequestError(f"request id {request.request_id!r} is already scheduled")
        if request.on_grid != self.grid_aligned:
            where = "on" if self.grid_aligned else "off"
            raise RequestError(
                f"request {request.request_id} was shaped for another block layout; this model's blocks "
                f"sit {where} the absolute grid: build it with request_for"
            )
        self.check_fits(request)
        if request.arrival_time is None:
            request.arrival_time = self.clock()
        self.requests[request.request_id] = request
        self._enqueue(request)

    def fits(self, request: Request) -> bool:
        """Whether the request can ever run here (a subclass with a budget checks it)."""
        return True

    def check_fits(self, request: Request) -> None:
        """Raise RequestError for a request this scheduler could never run."""

    def cancel(self, request_id: str) -> Request | None:
        request = self.requests.pop(request_id, None)
        if request is not None and not request.is_finished:
            self._withdraw(request)
            request.state, request.finish_reason = RequestState.CANCELLED, FinishReason.CANCELLED
            request.finish_time = self.clock()
        return request

    def has_unfinished(self) -> bool:
        return any(not r.is_finished for r in self.requests.values())

    # -- the cycle ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """The next cycle's rows, naming the requests whose rows have left since the last one."""
        output = self._next_cycle()
        if not output.is_empty:  # an empty cycle reaches no runner: what left is named at the next one
            present = set(output.request_ids)
            output.released = [i for i in self._in_rows if i not in present]  # in the last cycle's order
            self._in_rows = list(output.request_ids)
        return output

    def update_from_output(self, output: SchedulerOutput, blocks: list[list[int] | None]) -> list[Request]:
        """Commit each active row's block (None: its block goes on in the next cycle); return the requests
        that finished at this boundary."""
        now = self.clock()
        finished = []
        for request_id, row, block in zip(output.request_ids, output.rows, blocks):
            request = self.requests.get(request_id)
            if not row.active or block is None or request is None or request.is_finished:
                continue
            request.generated.extend(block)
            reason = self._finish_reason(request, block)
            if reason is not None:
                request.state, request.finish_reason, request.finish_time = RequestState.FINISHED, reason, now
                finished.append(request)
        self._after_update(output, finished)
        for request in finished:
            self.requests.pop(request.request_id, None)
        return finished

    def finish_reason_for(self, request: Request) -> FinishReason | None:
        """Why ``request`` is already finished by the blocks it has (None if it is not): a request
        resumed from stored progress may have committed its last block before its result was sent."""
        if not request.generated:
            return None
        return self._finish_reason(request, request.generated[-self.block_length :])

    def _finish_reason(self, request: Request, block: list[int]) -> FinishReason | None:
        if not self.ignore_eos and any(token in self.eos_ids for token in block):
            return FinishReason.EOS
        if request.blocks_done(self.block_length) >= request.max_blocks:
            return FinishReason.LENGTH
        return None

    def _mark_running(self, request: Request) -> None:
        if request.first_scheduled_time is None:
            request.first_scheduled_time = self.clock()
        request.state = RequestState.RUNNING

    # -- subclass hooks -----------------------------------------------------------------------
    def _next_cycle(self) -> SchedulerOutput:
        raise NotImplementedError

    def _enqueue(self, request: Request) -> None:
        raise NotImplementedError

    def _withdraw(self, request: Request) -> None:
        raise NotImplementedError

    def _after_update(self, output: SchedulerOutput, finished: list[Request]) -> None:
        """Called after commits, before finished requests are forgotten."""
