"""The worker's view of its Redis: reached or not, and how long to wait before the next try. A fault is
said once when it starts and once when it ends, not at every retry."""

from __future__ import annotations

import logging
import time

from dllm_contracts.queue.resilience import Backoff, is_loading

logger = logging.getLogger(__name__)


class RedisLink:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.connected = True  # False from a Redis fault until the next iteration that reaches Redis
        self._backoff = Backoff()

    def reached(self) -> None:
        if self._backoff.failing:
            logger.info("worker %s reached Redis again", self.worker_id)
        self._backoff.reset()
        self.connected = True

    def fault(self, exc: Exception, rows: int, results: int) -> None:
        """Say the fault (the ``rows`` and ``results`` kept meanwhile) when it starts, then wait."""
        if not self._backoff.failing:
            state = "Redis is loading its data" if is_loading(exc) else "cannot reach Redis"
            logger.warning(
                "worker %s: %s (%s: %s); keeping %d rows and %d results, retrying",
                self.worker_id,
                state,
                type(exc).__name__,
                exc,
                rows,
                results,
            )
        self.connected = False
        time.sleep(self._backoff.next_delay())
