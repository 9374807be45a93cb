"""No child is written for a service once its deletion began: reconciles and the delete handler agree.

Kopf runs a timer's resync beside the event handlers, and a resync that began before the service was
deleted holds the older view (no deletionTimestamp): on its own it would create again what the delete
handler just deleted (a profiling Job left holding a GPU, an engine Deployment). So each reconcile is
registered here by the service's uid; the delete handler marks the uid as being deleted (a reconcile then
starts no more, and one under way stops at its next write: k8s.writes_checked), deletes the children, waits
for the reconciles that were under way to end and deletes again what one may have written meanwhile (a
write already sent when the mark was set).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

REMEMBERED_DELETIONS = 1024  # uids kept as deleted (a uid is never reused; the oldest are forgotten)
IDLE_WAIT_S = 120.0  # the most a delete handler waits for a reconcile under way to stop


class ServiceDeleted(Exception):
    """The service this reconcile works for is being deleted: it writes nothing more."""


class DeletionGuard:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running: Counter[str] = Counter()  # reconciles under way, per uid
        self._deleted: OrderedDict[str, None] = OrderedDict()

    @contextmanager
    def reconciling(self, uid: str) -> Iterator[None]:
        """Hold a reconcile of ``uid``'s service; ServiceDeleted (before it starts) once its deletion began."""
        with self._changed:
            self.check(uid)
            self._running[uid] += 1
        try:
            yield
        finally:
            with self._changed:
                self._running[uid] -= 1
                if not self._running[uid]:
                    del self._running[uid]
                self._changed.notify_all()

    def check(self, uid: str) -> None:
        """ServiceDeleted if ``uid``'s deletion began (a reconcile's every write calls it first)."""
        if uid in self._deleted:
            raise ServiceDeleted(uid)

    def begin_deletion(self, uid: str) -> bool:
        """Mark ``uid`` as being deleted; True when reconciles of it are under way (they may still write)."""
        with self._changed:
            self._deleted[uid] = None
            self._deleted.move_to_end(uid)
            while len(self._deleted) > REMEMBERED_DELETIONS:
                self._deleted.popitem(last=False)
            return bool(self._running[uid])

    def wait_until_idle(self, uid: str, timeout_s: float = IDLE_WAIT_S) -> bool:
        """Whether no reconcile of ``uid`` is under way any more (each ends at its next write once the
        deletion began), waited for up to ``timeout_s`` (a call to an API server that does not answer)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._running[uid], timeout_s)
