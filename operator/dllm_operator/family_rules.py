"""What the engines would refuse at their start for the spec's model family, refused on the resource
instead (a Degraded condition, no engine pods that crash-loop on one line): dllm-serve's staggered
refreshes and the head-sparse cache each run some families and decodings only. The rules are the engine's
own (dllm_contracts/run_rules.py), judged by the family's cache kind from the family table."""

from __future__ import annotations

from dllm_contracts.families import FAMILY_KIND, FAMILY_NAMES
from dllm_contracts.run_rules import sparse_family_problem, stagger_problem
from dllm_operator.service_spec import ServiceSpec


def family_problems(spec: ServiceSpec) -> list[str]:
    """Each problem naming the field that asks for what the family cannot run (an unknown family: none
    here, spec.model.family is refused on its own)."""
    if spec.family not in FAMILY_KIND:
        return []
    name, kind = FAMILY_NAMES[spec.family], FAMILY_KIND[spec.family]
    problems = []
    if spec.policy == "dllm-serve":
        problem = stagger_problem(name, kind, spec.cache, spec.remasking)
        if problem:
            problems.append(f"scheduling.policy: {problem}")
    if spec.sparse_cache.on:
        problem = sparse_family_problem(name, kind)
        if problem:
            problems.append(f"decoding.sparseCache: {problem} (model.family {spec.family})")
    return problems
