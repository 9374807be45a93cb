"""Batches as work items under a lease, as requests are: the gateway holding a batch's lease ingests it
(from its cursor) and watches it to its end; it renews the lease while it runs. Every gateway process
sweeps the leases at start and then periodically, and takes over any batch whose lease expired (its
gateway stopped or died), so a batch outlives the gateway that created it. A lease is one gateway's at a
time, and ingestion checks it with every chunk: two live gateways never ingest the same batch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket

from dllm_contracts.queue.ops import as_text, now_ms
from dllm_contracts.queue.resilience import REDIS_ERRORS
from gateway.batch_ingest import LeaseLost, ingest_batch, mark_failed
from gateway.batch_lifecycle import watch

logger = logging.getLogger(__name__)

LEASE_MS = 10_000  # a batch whose gateway stopped renewing for this long is taken over by another
SWEEP_S = 2.0  # how often a gateway renews its batches' leases and looks for expired ones
SWEEP_COUNT = 16  # expired leases read per sweep
RETRY_S = 1.0  # after a Redis fault, ingestion resumes from the cursor after this pause


def new_gateway_id() -> str:
    """A gateway process's name as the owner of batch leases (host and pid for the logs, random for
    uniqueness across restarts)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class BatchKeeper:
    """One gateway process's batches: those whose lease it holds, each driven by a task."""

    def __init__(self, state, gateway: str) -> None:
        self.state = state
        self.gateway = gateway
        self.driving: dict[str, asyncio.Task] = {}

    async def run(self) -> None:
        """Renew what it holds and take over expired batches, every ``SWEEP_S`` (Redis faults waited out)."""
        while True:
            try:
                await self.renew()
                await self.sweep()
            except REDIS_ERRORS as exc:
                logger.warning("batch leases: %s; trying again", exc)
            await asyncio.sleep(SWEEP_S)

    def adopt(self, batch_id: str) -> None:
        """Drive a batch whose lease this gateway holds (one it just created)."""
        if batch_id in self.driving:
            return
        task = asyncio.create_task(self._drive(batch_id))
        self.driving[batch_id] = task
        task.add_done_callback(lambda _: self.driving.pop(batch_id, None))

    async def sweep(self) -> None:
        keys = self.state.queue.ops.keys
        expired = await self.state.redis.zrangebyscore(keys.batch_leases, "-inf", now_ms(), 0, SWEEP_COUNT)
        for batch_id in as_text(expired):
            if batch_id not in self.driving and await self._lease(batch_id, renew=False) == 1:
                logger.info("taking over batch %s", batch_id)
                self.adopt(batch_id)

    async def renew(self) -> None:
        for batch_id, task in list(self.driving.items()):
            if await self._lease(batch_id, renew=True) == 0:
                logger.warning("batch %s is another gateway's now; leaving it", batch_id)
                task.cancel()

    async def release(self) -> None:
        """On shutdown: every batch it drives is stopped and its lease left expired, for another gateway
        (or this one's successor) to take over at once."""
        held = dict(self.driving)
        for task in held.values():
            task.cancel()
        await asyncio.gather(*held.values(), return_exceptions=True)
        for batch_id in held:
            with contextlib.suppress(*REDIS_ERRORS):
                await self.state.queue.run(self.state.queue.ops.batch_lease(batch_id, self.gateway, 0, True))

    async def _lease(self, batch_id: str, renew: bool) -> int:
        call = self.state.queue.ops.batch_lease(batch_id, self.gateway, LEASE_MS, renew)
        return int(await self.state.queue.run(call))

    async def _drive(self, batch_id: str) -> None:
        try:
            await self._ingest(batch_id)
            await watch(self.state, batch_id)
        except LeaseLost:
            logger.warning("batch %s: another gateway took it over", batch_id)

    async def _ingest(self, batch_id: str) -> None:
        """Ingest from the cursor; a Redis fault is waited out (the cursor says where to resume), anything
        else fails the batch rather than leaving it ``validating``."""
        while True:
            try:
                await ingest_batch(batch_id, self.gateway, self.state)
                return
            except REDIS_ERRORS as exc:
                logger.warning("batch %s ingestion: %s; resuming", batch_id, exc)
                await asyncio.sleep(RETRY_S)
            except (LeaseLost, asyncio.CancelledError):
                raise
            except Exception as exc:
                logger.exception("batch %s ingestion failed", batch_id)
                await self.state.redis.hset(
                    self.state.queue.ops.keys.batch(batch_id), mapping=mark_failed(str(exc))
                )
                return
