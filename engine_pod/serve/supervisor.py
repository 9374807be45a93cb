"""Supervision for ``dllm serve``: start children in order, restart one that dies, stop them in reverse.

Each child is a process with a ``start()`` that returns once it answers (or raises ``RuntimeError``),
a ``process`` (its ``Popen``) and a ``stop()``. A child that dies is restarted with bounded, jittered
backoff and logged; a child that cannot start the first time ends supervision (``ChildCannotStart``),
since no retry will change a bad port or a missing model. Children run in their own session (a
terminal's Ctrl-C reaches the supervisor only, which then stops them in order) and get SIGTERM if
the supervisor dies, so none outlives it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dllm_contracts.queue.resilience import Backoff

logger = logging.getLogger(__name__)

STABLE_S = 30.0  # a child that ran this long starts its restart backoff afresh
PR_SET_PDEATHSIG = 1


class ChildCannotStart(RuntimeError):
    """A child failed its first start; the message says which and why, in one line."""


class Child(Protocol):
    process: subprocess.Popen | None

    def start(self) -> Child: ...

    def stop(self) -> None: ...


def die_with_parent() -> None:
    """``preexec_fn`` for children: SIGTERM when the process that started them dies (Linux)."""
    name = ctypes.util.find_library("c")
    if name:
        ctypes.CDLL(name).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def child_popen_options() -> dict:
    """What every supervised child is started with."""
    return {"start_new_session": True, "preexec_fn": die_with_parent}


@dataclass
class Supervised:
    name: str
    child: Child
    drains: bool = False  # its stop() takes a ``waiting(seconds left)`` callback (it drains for a while)
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=0.5, max_s=10.0))
    started_at: float = 0.0
    restart_at: float | None = None  # when a dead child is due to start again

    @property
    def pid(self) -> int | None:
        return self.child.process.pid if self.child.process else None

    def alive(self) -> bool:
        return self.child.process is not None and self.child.process.poll() is None


class Supervisor:
    def __init__(self, children: list[Supervised], poll_s: float = 0.2) -> None:
        self.children = children
        self.poll_s = poll_s
        self.stopping = threading.Event()
        self.forced = False  # stopped at once (kill_now), not drained

    def start_all(self, before: dict[str, Callable[[], None]] | None = None) -> None:
        """Start the children in order, a line each; a stop asked for meanwhile starts no more (and a start
        it cuts short is no error).
        ``before[name]()`` runs just before the child ``name`` starts; what it raises stops every child
        started so far and goes on up."""
        for item in self.children:
            if self.stopping.is_set():
                return
            if before and item.name in before:
                try:
                    before[item.name]()
                except BaseException:
                    self.stop_all()
                    raise
                if self.stopping.is_set():  # stopped while it ran
                    self.stop_all()
                    return
            logger.info("%s ...", getattr(item.child, "starting", f"starting the {item.name}"))
            try:
                item.child.start()
            except RuntimeError as exc:
                self.stop_all()
                if self.stopping.is_set():  # stopped while it started (Ctrl-C): no error of its own
                    logger.info("the %s did not start: %s", item.name, exc)
                    return
                raise ChildCannotStart(f"the {item.name} could not start: {exc}") from None
            item.started_at = time.monotonic()
            logger.info("the %s is ready (pid %s)", item.name, item.pid)

    def watch(self) -> None:
        """Restart dead children until ``stop()`` (a signal handler) is called."""
        while not self.stopping.wait(self.poll_s):
            for item in self.children:
                if not item.alive():
                    self._revive(item)

    def _revive(self, item: Supervised) -> None:
        now = time.monotonic()
        if item.restart_at is None:
            if now - item.started_at > STABLE_S:
                item.backoff.reset()
            item.restart_at = now + item.backoff.next_delay()
            status = item.child.process.returncode if item.child.process else None
            logger.warning(
                "the %s (pid %s) exited with status %s; restarting it in %.1f s",
                item.name,
                item.pid,
                status,
                item.restart_at - now,
            )
        if now < item.restart_at or self.stopping.is_set():
            return
        try:
            item.child.start()
        except RuntimeError as exc:
            item.restart_at = time.monotonic() + item.backoff.next_delay()
            logger.warning("the %s did not come back (%s); trying again", item.name, exc)
            return
        item.started_at, item.restart_at = time.monotonic(), None
        logger.info("restarted the %s (pid %s)", item.name, item.pid)

    def stop(self) -> None:
        self.stopping.set()

    def stop_all(self, waiting=None) -> None:
        """Stop every child, last started first (the gateway drains before the queue goes);
        ``waiting(name, seconds left)`` is called while a draining child finishes its work."""
        for item in reversed(self.children):
            if item.alive():
                logger.info("stopping the %s (pid %s)", item.name, item.pid)
            if item.drains and waiting is not None:
                item.child.stop(lambda left, name=item.name: waiting(name, left))
            else:
                item.child.stop()

    def kill_now(self, spare: tuple[str, ...] = ("redis-server",)) -> None:
        """Stop at once: SIGKILL every child but those in ``spare`` (Redis then stops as usual and keeps
        everything accepted in its append-only file)."""
        self.forced = True
        self.stopping.set()
        for item in self.children:
            if item.name not in spare and item.alive():
                item.child.process.kill()
