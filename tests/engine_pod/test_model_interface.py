"""Every registered family's model offers what its cache kind's stepper needs (the kind's declared
interface, runner/model_interface.py), and the interfaces declare everything the kinds and the cycle
driver ask of a model: a model that lacks a member, or a kind that uses one undeclared, fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from engine_pod.families.registry import registered_families
from engine_pod.kinds.canvas.context_cache import ContextConfig
from engine_pod.loading.loader import build_model
from engine_pod.loading.presets import PRESETS, preset_config
from engine_pod.runner.model_interface import TokenModel, conformance_problems

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine_pod"


def _configs_by_family() -> dict[str, object]:
    """A random preset's config of each family (the first preset that reads as it)."""
    configs: dict[str, object] = {}
    for name in PRESETS:
        config = preset_config(name)
        configs.setdefault(config.family, config)
    return configs


CONFIGS = _configs_by_family()


@pytest.mark.parametrize("family", registered_families(), ids=lambda family: family.name)
def test_every_family_model_offers_its_kinds_interface(family):
    assert family.name in CONFIGS, f"{family.name} has no random preset to build its model from"
    model = build_model(CONFIGS[family.name], torch.device("meta"), torch.float32)
    assert conformance_problems(model, family.kind.model_interface) == []
    if family.kind.canvas_rows:  # its context cache reads the model's config
        assert conformance_problems(model.config, ContextConfig) == []


def _members(interface: type) -> set[str]:
    """The attributes and methods an interface declares, its bases' included."""
    names: set[str] = set()
    for cls in interface.__mro__:
        if getattr(cls, "_is_protocol", False):
            names |= set(getattr(cls, "__annotations__", {})) | {
                n for n in vars(cls) if not n.startswith("_")
            }
    return names


def model_uses(source: str) -> set[str]:
    """The attributes code reads of a served model's model: ``<anything>.model.<name>``."""
    used = set()
    for node in ast.walk(ast.parse(source)):
        reads_model = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
        if reads_model and node.value.attr == "model":
            used.add(node.attr)
    return used


@pytest.mark.parametrize(
    "kind", sorted(p.name for p in (ENGINE / "kinds").iterdir() if p.is_dir() and p.name != "__pycache__")
)
def test_each_kind_uses_only_what_its_interface_declares(kind):
    interfaces = {
        family.kind.model_interface
        for family in registered_families()
        if family.kind.stepper.__module__.startswith(f"engine_pod.kinds.{kind}.")
    }
    assert len(interfaces) == 1, f"kind {kind}: {interfaces}"
    declared = _members(interfaces.pop())
    used = set().union(*(model_uses(p.read_text()) for p in (ENGINE / "kinds" / kind).rglob("*.py")))
    assert used and used <= declared, sorted(used - declared)


def test_the_cycle_driver_uses_only_what_every_model_declares():
    used = model_uses((ENGINE / "runner" / "cycle_driver.py").read_text())
    assert used and used <= _members(TokenModel) & _members(_canvas_interface())


def _canvas_interface() -> type:
    from engine_pod.kinds.canvas.model_interface import CanvasModel

    return CanvasModel


def test_the_checks_fail_on_a_model_that_falls_short():
    """A planted model lacking a method, one whose method takes other parameters, and a kind's code that
    reads an undeclared member are each found."""
    family = next(f for f in registered_families() if f.kind.model_interface is TokenModel)
    model = build_model(CONFIGS[family.name], torch.device("meta"), torch.float32)

    class NoPool(type(model)):
        new_pool = None

    class OtherParameters(type(model)):
        def forward_batch(self, rows, picks):  # not (batch, select)
            return None

    model.__class__ = NoPool
    assert any("new_pool" in p for p in conformance_problems(model, TokenModel))
    model.__class__ = OtherParameters
    assert any("forward_batch" in p for p in conformance_problems(model, TokenModel))
    del model.logit_budget
    assert any("logit_budget" in p for p in conformance_problems(model, TokenModel))
    planted = "def step(self):\n    return self.loaded.model.secret_forward(self.batch)\n"
    assert model_uses(planted) - _members(TokenModel) == {"secret_forward"}
