"""How ``dllm serve`` stops: the first Ctrl-C (or SIGTERM) drains, saying what is left and until when; a
second one stops at once and says what stays in Redis for the next start (batches) and what ended with the
stop (interactive requests: their clients' connections end with the gateway)."""

from __future__ import annotations

import logging
import os
import signal
import threading

from engine_pod.serve.queue_census import Census, census_of
from engine_pod.serve.supervisor import Supervisor

logger = logging.getLogger(__name__)
RELAYED = (signal.SIGTERM, signal.SIGINT)


def _noted(*_) -> None:
    """The Python-level handler: the wakeup fd has the signal already (``Stopping._relay`` acts on it)."""


class Stopping:
    """Signal handlers and the lines they print, for one ``dllm serve``."""

    def __init__(
        self, supervisor: Supervisor, redis_url: str, service: str, where: str, private: bool = True
    ) -> None:
        self.supervisor = supervisor
        self.redis_url, self.service = redis_url, service
        self.where = where  # where the accepted work is kept (the data directory, or the Redis URL)
        self.private = private  # its own Redis: the next start drops the requests a stop cut off
        self.left_at_kill: Census | None = None

    def install(self) -> None:
        """Ctrl-C and SIGTERM acted on in a thread of their own. A Python signal handler runs in the main
        thread between two of its bytecodes: one that set ``supervisor.stopping`` while the main thread held
        that event's lock (inside its ``wait``) would wait for itself forever, and ``dllm serve`` would hang
        on Ctrl-C. So the handlers do nothing; the signal's number reaches ``_relay`` through the wakeup fd."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for signum in RELAYED:
            signal.signal(signum, _noted)
        threading.Thread(target=self._relay, args=(read,), name="signals", daemon=True).start()

    def _relay(self, read: int) -> None:
        while True:
            for signum in os.read(read, 64):
                if signum in RELAYED:
                    self.on_signal()

    def on_signal(self, *_) -> None:
        if not self.supervisor.stopping.is_set():
            logger.info(
                "stopping: the gateway, then the worker finishes what it holds (Ctrl-C again: stop now)"
            )
            self.supervisor.stop()
            return
        if not self.supervisor.forced:
            self.left_at_kill = census_of(self.redis_url, self.service)
            self.supervisor.kill_now()

    def waiting(self, name: str, seconds_left: float) -> None:
        """A line every few seconds while a child drains."""
        left = census_of(self.redis_url, self.service)
        logger.info(
            "the %s is draining: %s in the queue, %.0f s to its deadline (Ctrl-C again: stop now)",
            name,
            "work" if left is None else left,
            seconds_left,
        )

    def farewell(self) -> int:
        """The last line, and the exit status: 0 after a drain, 130 after a stop at once."""
        if not self.supervisor.forced:
            logger.info("dllm serve stopped")
            return 0
        left = self.left_at_kill
        kept = "the accepted batches" if left is None else f"{left.batch_lines} batch lines"
        line = f"stopped at once: {kept} stay in Redis ({self.where}) and are served at the next start"
        if left is not None and left.requests:
            cut = Census(left.requests, left.choices, 0)
            line += f"; {cut} were cut off unanswered"
            line += " (the next start drops them: their clients are gone)" if self.private else ""
        logger.warning(line)
        return 130
