"""Logits the LM head materialized in this process (no torch): every family's head path adds each chunk
(models/logit_head.py), a block cycle reads what it added (runner/cycle_driver.py) into its stats,
which bench reports and the worker's /metrics show."""

from __future__ import annotations

import threading


class LogitCount:
    """Entries (positions x columns: the vocabulary, or k candidates) materialized in all, and the most
    that existed at once in one chunk since ``start``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries = 0
        self.peak = 0

    def add(self, positions: int, columns: int) -> None:
        with self._lock:
            self.entries += positions * columns
            self.peak = max(self.peak, positions * columns)

    def start(self) -> int:
        """Begin a span (a block cycle): the peak starts again; returns the entries so far."""
        with self._lock:
            self.peak = 0
            return self.entries

    def since(self, mark: int) -> tuple[int, int]:
        """Entries materialized since ``mark`` and the most at once."""
        with self._lock:
            return self.entries - mark, self.peak


LOGITS = LogitCount()
