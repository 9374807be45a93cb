"""dLLM-Serve's scheduler (its design document, section 2.2): BlockServe's admission and block-boundary
batches, with phase-multiplexed refreshes.

Each cycle carries a refresh quota (kinds/bidirectional/phase_plan.py decides, step by step, which rows refresh
within it): ``refresh_quota`` of the token budget while an interactive request is in the batch,
``batch_refresh_quota`` while only batch lines are; and each row's refresh interval.

Admission counts what a row costs in each phase. The token budget B is what one refresh cycle over B
tokens needs at its peak (the profile's measure): a token's cache, a share ``s`` of its cost
(``cache_share``), is held for the row's whole life, the rest is the refresh forward's and passes. With at
most ``q B`` positions refreshed in a step, a batch fits when
``s * sum(widths) + (1 - s) * (q B + rows * L) <= B``: each row costs its width, plus its reuse block at
the forward's share, against ``(B - (1 - s) q B) / s``. With ``s = 1`` that is BlockServe's admission; the
lower the cache's share, the more rows a quota lets in. A row must also refresh within the quota alone.

With the head-sparse cache a row holds only what its heads keep: its active block and a share ``k`` of
its context (``kept_share``, HeadSparseConfig.context_kept_share; 1: dense), so a row of width ``w``
costs ``L + ceil(k (w - L))`` of its width, and at one budget more rows are resident.
"""

from __future__ import annotations

import math
from dataclasses import replace

from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.scheduler.base import ClaimPlan
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.box import BatchBox
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.request import Request, RequestError


class DllmServeScheduler(BlockServeScheduler):
    staggers_refreshes = True

    def __init__(
        self, block_length: int, eos_ids, config: SchedulerConfig, kept_share: float = 1.0, **kwargs
    ) -> None:
        super().__init__(block_length, eos_ids, config, **kwargs)
        if not 0.0 < kept_share <= 1.0:
            raise ValueError(f"kept share must be in (0, 1], got {kept_share}")
        self.kept_share = kept_share  # of a row's context, what its cache holds (1: dense)
        share = config.cache_share
        self.row_extra = math.ceil((1 - share) / share * block_length)  # a row's reuse block, in width units

    def quota_tokens(self, batch_only: bool) -> int:
        """The most positions one step refreshes."""
        share = self.config.batch_refresh_quota if batch_only else self.config.refresh_quota
        return max(1, int(share * self.config.token_budget))

    @property
    def token_budget(self) -> int:
        """What the rows' widths (and their blocks' reuse shares) may add up to."""
        config = self.config
        budget, share = config.token_budget, config.cache_share
        quota = min(config.refresh_quota, config.batch_refresh_quota) * budget
        return int((budget - (1 - share) * quota) / share)

    def kept_width(self, width: int) -> int:
        """What a row of ``width`` positions holds in the cache: its active block and the kept share of
        the rest."""
        context = max(width - self.block_length, 0)
        return width - context + math.ceil(round(self.kept_share * context, 9))

    def held_row_width(self, width: int) -> int:
        return self.kept_width(width) + self.row_extra

    def _held_width(self, request: Request, box: BatchBox) -> int:
        return self.held_row_width(super()._held_width(request, box))

    @property
    def row_quota(self) -> int:
        """The most positions a row may refresh: the smaller quota, so that no step's refreshes pass its
        quota whichever lanes share it (a batch line runs in both kinds of cycle, and a row carried on may
        go from one into the other)."""
        return min(self.quota_tokens(False), self.quota_tokens(True))

    def fits(self, request: Request) -> bool:
        """Whether the request can ever run here: within the budget, and refreshing within the smaller
        refresh quota alone."""
        width = request.peak_width(self.block_length)
        return self.kept_width(width) + self.row_extra <= self.token_budget and width <= self.row_quota

    def check_fits(self, request: Request) -> None:
        if not self.fits(request):
            width = request.peak_width(self.block_length)
            raise RequestError(
                f"request {request.request_id} needs {width} tokens at its last block (prompt "
                f"{request.prompt_len} + {request.max_blocks} blocks of {self.block_length}), more than one "
                f"step's refresh quota {self.row_quota} of the token budget {self.config.token_budget}"
            )

    def _next_cycle(self) -> SchedulerOutput:
        output = super()._next_cycle()
        if not output.is_empty:
            batch_only = all(r.in_batch for r in self.active)
            output.refresh_quota = self.quota_tokens(batch_only)
            output.refresh_interval = self.config.refresh_interval
            output.step_level = self.config.step_level
        return output

    def claim_plan(self) -> ClaimPlan | None:
        """BlockServe's, for rows that also cost their reuse share and refresh within the quota."""
        plan = super().claim_plan()
        if plan is None:
            return None
        held_prefix = plan.max_prefix - self.row_extra  # of the held width, what a prefix may take
        widest = min(math.floor(held_prefix / self.kept_share), self.row_quota - self.block_length)
        return replace(plan, max_prefix=widest) if widest >= 1 else None
