"""The pending queue, kept sorted by prefix length (prompt plus committed blocks), ties by arrival."""

from __future__ import annotations

import bisect
import itertools

from engine_pod.scheduler.request import Request


class PendingQueue:
    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._requests: list[Request] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self):
        return iter(self._requests)

    def push(self, request: Request) -> None:
        key = (request.prefix_len(), next(self._order))
        index = bisect.bisect(self._keys, key)
        self._keys.insert(index, key)
        self._requests.insert(index, request)

    def remove(self, request: Request) -> None:
        index = self._requests.index(request)
        del self._keys[index]
        del self._requests[index]

    def shortest(self) -> Request | None:
        return self._requests[0] if self._requests else None

    def longest_at_most(self, prefix_len: int) -> Request | None:
        """The pending request with the longest prefix not above ``prefix_len`` (sand filling)."""
        index = bisect.bisect(self._keys, (prefix_len, float("inf")))
        return self._requests[index - 1] if index else None

    def longest_waiting(self) -> Request | None:
        """The request pending for the most block cycles; the earliest queued among equals."""
        if not self._requests:
            return None
        index = max(
            range(len(self._requests)), key=lambda i: (self._requests[i].waited_cycles, -self._keys[i][1])
        )
        return self._requests[index]

    def find(self, request_id: str) -> Request | None:
        return next((r for r in self._requests if r.request_id == request_id), None)
