"""The logit budget's ranges (``dllm worker --max-materialized-logits``, ``--logit-candidates``), torch-free:
the engine's DecodingConfig and the operator's spec check both take them from here."""

from __future__ import annotations


def logit_problems(max_materialized_logits: int | None, logit_candidates: int) -> dict[str, str]:
    """What is out of range, by DecodingConfig's field name, each message to follow the field's name
    (nothing when both are in range; ``max_materialized_logits`` None is automatic)."""
    problems = {}
    if max_materialized_logits is not None and max_materialized_logits < 1:
        problems["max_materialized_logits"] = f"must be at least 1 position, got {max_materialized_logits}"
    if logit_candidates < 0:
        problems["logit_candidates"] = f"must be at least 0, got {logit_candidates}"
    return problems
