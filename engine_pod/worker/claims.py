"""What a worker claims from the shared queue: the scheduler plans the read (how many, how wide), chooses
among the candidates read (their sizes and waits, not their tokens), and every claimed request is one it
admits now. A claim that lost some candidates to another worker can leave one the scheduler no longer
admits: it goes straight back. Requests that can never fit the budget are claimed to be answered with an
error."""

from __future__ import annotations

import logging
from collections.abc import Callable

from dllm_contracts.queue.ops import ANY_WAIT, Candidate, Claimed
from dllm_contracts.queue.sync_client import CLAIM_ROUNDS, SyncQueue
from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.scheduler.base import ClaimPlan, Scheduler
from engine_pod.scheduler.request import Request

logger = logging.getLogger(__name__)

AGED_READ = 8  # requests waiting past the bound read per claim (the oldest first)


class Claims:
    def __init__(
        self, queue: SyncQueue, scheduler: Scheduler, scheduling: SchedulerConfig, worker_id: str
    ) -> None:
        self.queue, self.scheduler, self.scheduling, self.worker_id = queue, scheduler, scheduling, worker_id

    def take(
        self,
        admit: Callable[[Claimed, float | None], None],
        drop: Callable[[str], None],
        batch_room: Callable[[], int | None],
    ) -> None:
        """Claim what the scheduler would admit now, in rounds: ``admit`` each claimed request (with its
        arrival time), ``drop`` one handed straight back; ``batch_room``: batch lines it may take now."""
        for _ in range(CLAIM_ROUNDS):
            plan = self.scheduler.claim_plan()
            if plan is None:
                return
            read = self._read(plan, batch_room())
            candidates = {c.id: c for c in [*read.aged, *read.shortest]}
            shapes = {c.id: self.shape(c) for c in candidates.values()}
            chosen = [r.request_id for r in self.scheduler.choose(list(shapes.values()))]
            chosen += [i for i, shape in shapes.items() if not self.scheduler.fits(shape)]
            claimed = self.queue.claim_chosen(self.worker_id, [(i, candidates[i].prefix) for i in chosen])
            for item in claimed:
                item.queued_s = candidates[item.request.id].queued_s
                admit(item, shapes[item.request.id].arrival_time)
            self._hand_back_unadmittable({item.request.id for item in claimed}, drop)
            if not chosen or (len(claimed) == len(chosen) and len(read.shortest) < plan.count):
                return  # nothing more is admissible, or the queue has nothing more to offer

    def _read(self, plan: ClaimPlan, batch_room: int | None):
        if plan.oldest_first:
            return self.queue.candidates(0, 0, ANY_WAIT, plan.count, batch_room=batch_room)
        scheduling = self.scheduling
        return self.queue.candidates(
            plan.max_prefix,
            plan.count,
            scheduling.max_wait_s,
            AGED_READ,
            scheduling.batch_max_wait_s,
            batch_room,
        )

    def shape(self, candidate: Candidate) -> Request:
        """A candidate as the scheduler sees it: its sizes and its wait, shaped into blocks as its request
        will be when admitted (not its tokens: it is not claimed yet)."""
        shape = self.scheduler.request_for(
            candidate.id,
            (0,) * max(1, candidate.prompt_tokens),
            RequestParams(max_tokens=max(1, candidate.max_tokens)),
            arrival_time=self.scheduler.clock() - candidate.waited_s,
        )
        shape.generated = [0] * max(0, candidate.prefix - candidate.prompt_tokens)
        return shape

    def _hand_back_unadmittable(self, just_claimed: set[str], drop: Callable[[str], None]) -> None:
        for request in self.scheduler.unadmittable():
            if request.request_id in just_claimed:
                logger.info("handing %s back: another worker took part of the claim", request.request_id)
                self.queue.release(
                    self.worker_id, request.request_id, request.generated, request.prefix_len()
                )
                drop(request.request_id)
