"""A family variant is configuration alone: LLaDA with a GELU-gated MLP is a LLaDA checkpoint whose
config.json says ``activation_type: gelu``. Given its own name (``model_type: llada_gelu``), it is a record,
``replace(LLaDA's, name=...)``, added to a copy of the source tree by docs/design.md's recipe
(tests/engine_pod/family_recipe.py), and it runs through ``dllm generate``, ``dllm bench`` (BlockServe and
static) and ``dllm serve``, and the regenerated CRD, chart and lists name it."""

from __future__ import annotations

import json

import pytest
import torch

from engine_pod.loading.loader import load_model
from tests.engine_pod.family_recipe import (
    NewFamily,
    checkpoint_of,
    engine_logits,
    follow_the_recipe,
    generate_and_bench,
    lists_name_it,
    naive_logits,
    run,
    serve_answers,
)
from tests.serving_utils import write_served_model

VARIANT = NewFamily(
    name="llada_gelu",
    display_name="LLaDA-GELU",
    module='''"""LLaDA-GELU (``model_type: llada_gelu``): LLaDA with a GELU-gated MLP, by configuration alone (its
config.json says ``activation_type: gelu``)."""

from dataclasses import replace

from engine_pod.families.llada import FAMILY as LLADA

FAMILY = replace(
    LLADA,
    name="llada_gelu",
    display_name="LLaDA-GELU",
    summary="a LLaDA variant with a GELU-gated MLP",
    model_types=("llada_gelu",),
    checkpoints="acme/LLaDA-GELU-8B",
    tiny_preset="llada-gelu-tiny",
)
''',
    preset="llada-gelu-tiny",
    preset_fields='PRESETS["llada-tiny"] | {"model_type": "llada_gelu", "activation_type": "gelu"}',
)
PROBE = """
import sys
from engine_pod.loading.loader import load_model
for spec in sys.argv[1:]:  # each model: one line
    loaded = load_model(spec)
    mlp = loaded.model.layers[0].mlp
    print(loaded.config.family, loaded.config.activation, mlp.activation.func.__name__, loaded.family.kind.name)
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return follow_the_recipe(tmp_path_factory.mktemp("tree"), VARIANT)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model") / VARIANT.served_name
    return checkpoint_of(directory, VARIANT, activation_type="gelu")


def test_the_variant_loads_as_its_own_family_with_a_gelu_mlp(tree, checkpoint):
    found, preset = run(tree, "-c", PROBE, str(checkpoint), f"random:{VARIANT.preset}").splitlines()
    assert found.split() == [VARIANT.name, "gelu", "gelu", "bidirectional"]
    assert preset.split() == [VARIANT.name, "gelu", "gelu", "bidirectional"]


def test_the_variants_logits_are_a_gelu_mlps(tree, checkpoint, tmp_path):
    family, logits = engine_logits(tree, str(checkpoint), tmp_path / "logits.pt")
    assert family == VARIANT.name
    torch.testing.assert_close(logits, naive_logits(checkpoint), rtol=0, atol=1e-10)


def test_a_llada_checkpoint_that_says_gelu_is_llada_with_a_gelu_mlp(tmp_path):
    """Without a record of its own: LLaDA's reader takes the activation from config.json."""
    directory = write_served_model(tmp_path / "llada")
    raw = json.loads((directory / "config.json").read_text()) | {"activation_type": "gelu"}
    (directory / "config.json").write_text(json.dumps(raw))
    loaded = load_model(str(directory))
    assert (loaded.config.family, loaded.config.activation) == ("llada", "gelu")
    assert loaded.model.layers[0].mlp.activation.func is torch.nn.functional.gelu


def test_generate_and_bench_run_the_variant(tree, checkpoint):
    generate_and_bench(tree, str(checkpoint))


def test_serve_answers_with_the_variant(tree, checkpoint, tmp_path):
    serve_answers(tree, str(checkpoint), VARIANT.served_name, tmp_path)


def test_the_regenerated_crd_chart_and_lists_name_the_variant(tree):
    lists_name_it(tree, VARIANT)
