"""The pending queue, kept in two orders: by prefix length (prompt plus committed blocks, ties by
arrival) for sand filling, and by arrival time for fairness (the longest-waiting request)."""

from __future__ import annotations

import bisect
import itertools

from engine_pod.scheduler.request import Request


class PendingQueue:
    def __init__(self, requests: list[Request] = ()) -> None:
        self._keys: list[tuple[int, int]] = []  # (prefix length, order), sorted
        self._requests: list[Request] = []  # in the order of _keys
        self._arrivals: list[tuple[float, int]] = []  # (arrival time, order), sorted
        self._by_order: dict[int, Request] = {}
        self._order_of: dict[str, int] = {}
        self._counter = itertools.count()
        for request in requests:
            self.push(request)

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self):
        return iter(self._requests)

    def copy(self) -> PendingQueue:
        """A queue of the same requests, to try admissions on without changing this one."""
        return PendingQueue(sorted(self._requests, key=lambda r: self._order_of[r.request_id]))

    def push(self, request: Request) -> None:
        order = next(self._counter)
        key = (request.prefix_len(), order)
        index = bisect.bisect(self._keys, key)
        self._keys.insert(index, key)
        self._requests.insert(index, request)
        bisect.insort(self._arrivals, (request.arrival_time or 0.0, order))
        self._by_order[order] = request
        self._order_of[request.request_id] = order

    def remove(self, request: Request) -> None:
        order = self._order_of.pop(request.request_id)
        index = bisect.bisect_left(self._keys, (request.prefix_len(), order))
        del self._keys[index]
        del self._requests[index]
        self._arrivals.remove((request.arrival_time or 0.0, order))
        del self._by_order[order]

    def shortest(self, skip: frozenset[str] | set[str] = frozenset()) -> Request | None:
        """The shortest request whose id is not in ``skip``."""
        return next((r for r in self._requests if r.request_id not in skip), None)

    def longest_waiting(self, skip: frozenset[str] | set[str] = frozenset()) -> Request | None:
        """The request that arrived first (the earliest queued among equals), of those not in ``skip``."""
        waiting = (self._by_order[order] for _, order in self._arrivals)
        return next((r for r in waiting if r.request_id not in skip), None)

    def find(self, request_id: str) -> Request | None:
        order = self._order_of.get(request_id)
        return None if order is None else self._by_order[order]
