"""How ``dllm serve`` stops: the first Ctrl-C (or SIGTERM) drains, saying what is left and until when; a
second one stops at once and says that the accepted work waits in Redis for the next start."""

from __future__ import annotations

import logging
import signal

from engine_pod.serve.supervisor import Supervisor

logger = logging.getLogger(__name__)


def queue_depth(redis_url: str, service: str) -> int | None:
    """Accepted requests not yet done (pending or in flight), or None when Redis does not answer."""
    from dllm_contracts.queue.connect import sync_client
    from dllm_contracts.queue.keys import ServiceKeys

    try:
        client = sync_client(redis_url, socket_timeout=1, socket_connect_timeout=1)
        try:
            return int(client.scard(ServiceKeys(service).live))
        finally:
            client.close()
    except Exception:  # noqa: BLE001 (any failure only means the count is not known)
        return None


class Stopping:
    """Signal handlers and the lines they print, for one ``dllm serve``."""

    def __init__(self, supervisor: Supervisor, redis_url: str, service: str, where: str) -> None:
        self.supervisor = supervisor
        self.redis_url, self.service = redis_url, service
        self.where = where  # where the accepted work is kept (the data directory, or the Redis URL)
        self.left_at_kill: int | None = None

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)

    def on_signal(self, *_) -> None:
        if not self.supervisor.stopping.is_set():
            logger.info(
                "stopping: the gateway, then the worker finishes what it holds (Ctrl-C again: stop now)"
            )
            self.supervisor.stop()
            return
        if not self.supervisor.forced:
            self.left_at_kill = queue_depth(self.redis_url, self.service)
            self.supervisor.kill_now()

    def waiting(self, name: str, seconds_left: float) -> None:
        """A line every few seconds while a child drains."""
        left = queue_depth(self.redis_url, self.service)
        count = "requests" if left is None else f"{left} requests"
        logger.info(
            "the %s is draining: %s in the queue, %.0f s to its deadline (Ctrl-C again: stop now)",
            name,
            count,
            seconds_left,
        )

    def farewell(self) -> int:
        """The last line, and the exit status: 0 after a drain, 130 after a stop at once."""
        if not self.supervisor.forced:
            logger.info("dllm serve stopped")
            return 0
        count = (
            "the accepted requests" if self.left_at_kill is None else f"{self.left_at_kill} accepted requests"
        )
        logger.warning(
            "stopped at once: %s stay in Redis (%s) and are served at the next start", count, self.where
        )
        return 130
