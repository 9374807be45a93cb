"""How an idle worker waits for work: the queue's wakeups (every enqueue publishes one), and the batch
window that lets a burst in before the first cycle."""

from __future__ import annotations

import time

from dllm_contracts.scheduler_config import BURST_QUIET_S


class Wakeups:
    """Listens on the queue's wakeup channel through a redis-py pubsub."""

    def __init__(self, pubsub, channel: str) -> None:
        self.pubsub = pubsub
        self.channel = channel
        self.subscribed = False
        self.quiet_s = BURST_QUIET_S  # the pause in arrivals that ends a batch window
        self.in_batch_window = False  # woken by new work, waiting while more keeps arriving

    def wait(self, idle_wait_s: float, batch_window_s: float) -> None:
        """Until work arrives or ``idle_wait_s`` has passed; when it arrives, through the batch window."""
        if not self.subscribed:  # once: after a dropped connection redis-py subscribes again itself
            self.pubsub.subscribe(self.channel)
            self.subscribed = True
        if self.arrivals_within(idle_wait_s):
            self._let_the_burst_in(batch_window_s)

    def _let_the_burst_in(self, window: float) -> None:
        """Work came to an idle worker: while more keeps arriving (a burst on its way through the
        gateway), wait, up to the batch window, so that the first cycle takes the burst and not only its
        first request (the rest would join a block later and finish a cycle later). Every enqueue
        publishes a wakeup, so the pause that ends the window is timed from the last arrival itself
        (sampling the queue's depth every quiet_s ended it up to twice that late)."""
        give_up = time.monotonic() + window
        self.in_batch_window = True
        try:
            while (left := give_up - time.monotonic()) > 0:
                if not self.arrivals_within(min(self.quiet_s, left)):
                    return
        finally:
            self.in_batch_window = False

    def arrivals_within(self, timeout: float) -> bool:
        """Whether a wakeup comes within ``timeout`` seconds; those already delivered are read with it."""
        if self.pubsub.get_message(timeout=timeout) is None:
            return False
        while self.pubsub.get_message() is not None:
            pass
        return True
