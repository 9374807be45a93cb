"""What a model family and its decoding can run, as the engine refuses it at start (torch-free: the operator
refuses the same on the DLLMService, with a condition, before it renders engine pods that would
crash-loop on it).

A family is known here by its display name and its cache kind's name (``bidirectional``: LLaDA, Dream;
``block_causal``: the block-diffusion families; ``canvas``: DiffusionGemma), as the engine's registry
(engine_pod/kinds/) and dllm_contracts/family_table.py both say it."""

from __future__ import annotations

# the cache kinds' names (engine_pod/kinds/): the one whose refreshes dLLM-Serve staggers and whose cache
# can be head-sparse, the one that keeps exact blocks (a prefix cache), DiffusionGemma's
BIDIRECTIONAL_NAME, BLOCK_CAUSAL_NAME, CANVAS_NAME = "bidirectional", "block_causal", "canvas"
STEP_FREE_POLICIES = ("threshold",)  # remasking policies whose commits do not depend on the step's number


def stagger_problem(family: str, family_kind: str, cache: str, remasking: str) -> str | None:
    """Why a model and decoding cannot run dllm-serve's staggered refreshes (None: they can)."""
    if family_kind == BIDIRECTIONAL_NAME and cache == "dual" and remasking in STEP_FREE_POLICIES:
        return None
    return (
        "policy dllm-serve staggers the dual cache's refreshes: it runs LLaDA or Dream with --cache dual and "
        f"--remasking {' or '.join(STEP_FREE_POLICIES)}, not {family} with --cache {cache} and --remasking "
        f"{remasking}"
    )


def stagger_problem_for(family, decoding) -> str | None:
    """``stagger_problem`` of a family record (its display name and cache kind) and a decoding config."""
    facts = (family.display_name, family.kind.name, decoding.cache, decoding.remasking)
    return stagger_problem(*facts)


def sparse_family_problem(family: str, family_kind: str) -> str | None:
    """Why a family cannot run the head-sparse cache (None: it can): a dual-cache family's alone."""
    if family_kind == BIDIRECTIONAL_NAME:
        return None
    return f"the head-sparse cache supports LLaDA and Dream (dual cache), not {family}"
