"""The model families a DLLMService may name, and the decoding each one starts from (no torch).

The operator fills a service's unset ``decoding.blockLength`` and ``decoding.stepsPerBlock`` from here and
renders them as the engine's ``--block-length`` and ``--steps-per-block``. The engine's family registry
(engine_pod/families/registry.py) owns them: scripts/generate_family_tables.py writes them into
family_table.py and the CRD's CEL rules (tests fail when either drifts).
"""

from __future__ import annotations

from dataclasses import dataclass

from dllm_contracts.family_table import FAMILY_TABLE


@dataclass(frozen=True)
class FamilyDecoding:
    """What a family decodes with when the service does not say."""

    block_length: int  # tokens denoised together (DiffusionGemma: its canvas)
    steps_per_block: int  # denoising steps per block at most (DiffusionGemma: per canvas)


FAMILY_DECODING: dict[str, FamilyDecoding] = {
    row["name"]: FamilyDecoding(block_length=row["block_length"], steps_per_block=row["steps_per_block"])
    for row in FAMILY_TABLE
}
FAMILIES = tuple(FAMILY_DECODING)
DEFAULT_FAMILY = FAMILIES[0]
# how users know each family (help texts, the package summary and README name every one)
FAMILY_NAMES: dict[str, str] = {row["name"]: row["display_name"] for row in FAMILY_TABLE}
# each family's cache kind (engine_pod/kinds/): bidirectional (LLaDA, Dream), block_causal (block diffusion),
# canvas (DiffusionGemma)
FAMILY_KIND: dict[str, str] = {row["name"]: row["kind"] for row in FAMILY_TABLE}
# the families whose experts parallelism.expert (the engine's --expert-parallel) spreads over ranks
EXPERT_FAMILIES = tuple(row["name"] for row in FAMILY_TABLE if row["expert_parallel"])
FAMILIES_IN_WORDS = ", ".join(FAMILY_NAMES[family] for family in FAMILIES)


def family_decoding(family: str) -> FamilyDecoding:
    """The family's defaults; ValueError naming the families for one that is none of them."""
    if family not in FAMILY_DECODING:
        raise ValueError(f"model family {family!r} is not one of {', '.join(FAMILIES)}")
    return FAMILY_DECODING[family]
