"""Workloads whose requests share what they begin with: a common prefix, and chat conversations.

- ``shared-prefix[:n=64,prefix=1024,question=16-64,gen=32-64,seed=0]``: every request is one long
  prefix (a system prompt, few-shot examples) followed by its own question.
- ``multi-turn[:conversations=16,turns=4,message=32-128,gen=32-64,seed=0]``: conversations whose every
  turn resends the whole history (earlier messages and the model's answers) with a new message; a turn
  is sent when the previous one is answered.

Token-only items (random ids of the given lengths), like ``synthetic``.
"""

from __future__ import annotations

import random
import re

from engine_pod.bench.workload_item import WorkloadError, WorkloadItem, parse_range

SHARED_PREFIX = re.compile(r"^shared-prefix(?::(?P<params>.*))?$")
MULTI_TURN = re.compile(r"^multi-turn(?::(?P<params>.*))?$")


def _options(params: str | None, defaults: dict[str, str], name: str) -> dict[str, str]:
    options = dict(defaults)
    for part in filter(None, (params or "").split(",")):
        key, _, value = part.partition("=")
        if key not in options:
            raise WorkloadError(f"{name} workload: unknown option {key!r} (use {', '.join(defaults)})")
        options[key] = value
    return options


def _count(options: dict[str, str], key: str, name: str, minimum: int = 1) -> int:
    try:
        value = int(options[key])
    except ValueError as exc:
        raise WorkloadError(f"{name} workload: {key} must be an integer, got {options[key]!r}") from exc
    if value < minimum:
        raise WorkloadError(f"{name} workload: {key} must be at least {minimum}, got {value}")
    return value


def shared_prefix(params: str | None) -> list[WorkloadItem]:
    name = "shared-prefix"
    options = _options(params, dict(n="64", prefix="1024", question="16-64", gen="32-64", seed="0"), name)
    rng = random.Random(_count(options, "seed", name, minimum=0))
    prefix = _count(options, "prefix", name)
    (qlo, qhi), (glo, ghi) = parse_range(options["question"], "question"), parse_range(options["gen"], "gen")
    return [
        WorkloadItem(
            f"shared-{i}", None, rng.randint(qlo, qhi), rng.randint(glo, ghi), shared_prefix_tokens=prefix
        )
        for i in range(_count(options, "n", name))
    ]


def multi_turn(params: str | None) -> list[WorkloadItem]:
    name = "multi-turn"
    defaults = dict(conversations="16", turns="4", message="32-128", gen="32-64", seed="0")
    options = _options(params, defaults, name)
    rng = random.Random(_count(options, "seed", name, minimum=0))
    (mlo, mhi), (glo, ghi) = parse_range(options["message"], "message"), parse_range(options["gen"], "gen")
    items = []
    for c in range(_count(options, "conversations", name)):
        previous = None
        for t in range(_count(options, "turns", name)):
            request_id = f"chat-{c}-turn-{t}"
            items.append(
                WorkloadItem(request_id, None, rng.randint(mlo, mhi), rng.randint(glo, ghi), follows=previous)
            )
            previous = request_id
    return items


def generated_workload(name: str) -> list[WorkloadItem] | None:
    """The items of a shared-prefix or multi-turn spec; None for any other name."""
    for pattern, make in ((SHARED_PREFIX, shared_prefix), (MULTI_TURN, multi_turn)):
        match = pattern.match(name)
        if match:
            return make(match.group("params"))
    return None
