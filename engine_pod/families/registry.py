"""Every model family the engine serves: one entry each, the module that builds its ``ModelFamily``.

A checkpoint's family is the one whose ``model_types`` hold its config.json's ``model_type``; a config
carries its family's name, which ``family_of`` turns back into the record. The first entry is the default
a DLLMService starts from. ``scripts/generate_family_tables.py`` writes the CRD's, the chart's and
``dllm_contracts``' lists from here (tests fail when they drift).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from engine_pod.families.record import ModelFamily
from engine_pod.models.config import ModelConfigError

FAMILY_MODULES = (
    "engine_pod.families.llada",
    "engine_pod.families.dream",
    "engine_pod.families.llada2",
    "engine_pod.families.sdar",
    "engine_pod.families.diffusion_gemma.family",
)


@functools.cache
def registered_families() -> tuple[ModelFamily, ...]:
    """The records, in the registry's order; a name or a model_type claimed twice is refused."""
    families = tuple(importlib.import_module(module).FAMILY for module in FAMILY_MODULES)
    names = [family.name for family in families]
    types = [t for family in families for t in family.model_types]
    for what, values in (("family name", names), ("model_type", types)):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"{what} {twice[0]!r} is registered twice")
    return families


def family_names() -> tuple[str, ...]:
    return tuple(family.name for family in registered_families())


def family_named(name: str) -> ModelFamily:
    """The family called ``name``; ModelConfigError naming the families for any other."""
    for family in registered_families():
        if family.name == name:
            return family
    raise ModelConfigError(f"model family {name!r} is not one of {', '.join(family_names())}")


def family_of(config: Any) -> ModelFamily:
    """The family a config was read for."""
    return family_named(config.family)


def family_for_model_type(model_type: Any) -> ModelFamily:
    """The family that reads config.json's ``model_type`` (compared in lower case)."""
    wanted = str(model_type or "").lower()
    for family in registered_families():
        if wanted in family.model_types:
            return family
    known = ", ".join(repr(t) for family in registered_families() for t in family.model_types)
    raise ModelConfigError(f"unknown model_type {model_type!r} in config.json; supported: {known}")
