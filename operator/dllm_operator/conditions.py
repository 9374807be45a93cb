"""metav1.Condition bookkeeping: lastTransitionTime changes only when the status does."""

from __future__ import annotations

import datetime
from typing import Any


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]], kind: str, status: bool, reason: str, message: str, generation: int
) -> list[dict[str, Any]]:
    """A new conditions list with ``kind`` set; other conditions unchanged."""
    value = "True" if status else "False"
    previous = next((c for c in conditions if c.get("type") == kind), None)
    changed = previous is None or previous.get("status") != value
    condition = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now() if changed else previous.get("lastTransitionTime", now()),
    }
    return [c for c in conditions if c.get("type") != kind] + [condition]


def condition(conditions: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)
