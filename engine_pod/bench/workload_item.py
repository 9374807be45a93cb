"""One benchmark request as a workload describes it, and the errors of reading workloads."""

from __future__ import annotations

from dataclasses import dataclass


class WorkloadError(ValueError):
    """A workload name, file or line that cannot be used."""


@dataclass(frozen=True)
class WorkloadItem:
    request_id: str
    prompt: str | None  # the user's message; None for synthetic token-only items
    prompt_tokens: (
        int  # its length with the shipped tokenizer's chat template (geometry for tokenizer-less models)
    )
    max_tokens: int  # generation budget
    task: str | None = None
    answer: str | None = None  # the exact reference answer, when known
    shared_prefix_tokens: int = 0  # a run of tokens common to every item that has one, before its prompt
    follows: str | None = None  # a chat's next turn: sent after this request, behind its prompt and answer


def parse_range(text: str, name: str) -> tuple[int, int]:
    try:
        low, _, high = text.partition("-")
        return int(low), int(high or low)
    except ValueError as exc:
        raise WorkloadError(f"synthetic workload: {name} must be N or LOW-HIGH, got {text!r}") from exc
