"""A new architecture on an existing cache kind is one module and one entry: a model whose layers are
wired otherwise (GPT-J's parallel layout, attention and the MLP both reading the layer's input) on the dual
cache, added to a copy of the source tree by docs/design.md's recipe (tests/engine_pod/family_recipe.py):
its module names its block and its record, nothing else of the engine changes. Its logits are the parallel
layout's (tests/naive_reference.py), and it runs through ``dllm generate`` (also split over two processes),
``dllm bench`` (BlockServe and static), ``dllm serve`` with the openai client, and the regenerated CRD,
chart and lists."""

from __future__ import annotations

import json

import pytest
import torch

from tests.engine_pod.family_recipe import (
    NewFamily,
    checkpoint_of,
    dllm,
    engine_logits,
    follow_the_recipe,
    generate_and_bench,
    lists_name_it,
    naive_logits,
    serve_answers,
)

PARALLEL = NewFamily(
    name="llada_parallel",
    display_name="LLaDA-Parallel",
    module='''"""LLaDA-Parallel (``model_type: llada_parallel``): LLaDA's weights and names in GPT-J's parallel layout,
each layer's attention and MLP reading the layer's input through their own norms, both outputs added to it."""

from dataclasses import replace

from engine_pod.families.llada import FAMILY as LLADA
from engine_pod.models.layers import DecoderBlock
from engine_pod.models.transformer import DiffusionTransformer


class ParallelBlock(DecoderBlock):
    """x + attention(attn_norm(x)) + mlp(mlp_norm(x))."""

    def forward(self, x, cos, sin, batch, queries=None):
        attended = self.attn(self.attn_norm(x), cos, sin, batch, queries)
        x = x if queries is None else x[:, queries]
        return x + attended + self.mlp(self.mlp_norm(x))


class ParallelLLaDA(DiffusionTransformer):
    block_type = ParallelBlock


FAMILY = replace(
    LLADA,
    name="llada_parallel",
    display_name="LLaDA-Parallel",
    summary="LLaDA's weights in a parallel attention and MLP layout",
    model_types=("llada_parallel",),
    architecture=ParallelLLaDA,
    checkpoints="acme/LLaDA-Parallel-8B",
    tiny_preset="llada-parallel-tiny",
)
''',
    preset="llada-parallel-tiny",
    preset_fields='PRESETS["llada-tiny"] | {"model_type": "llada_parallel"}',
)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return follow_the_recipe(tmp_path_factory.mktemp("tree"), PARALLEL)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return checkpoint_of(tmp_path_factory.mktemp("model") / PARALLEL.served_name, PARALLEL)


def test_its_logits_are_the_parallel_layouts(tree, checkpoint, tmp_path):
    family, logits = engine_logits(tree, str(checkpoint), tmp_path / "logits.pt")
    assert family == PARALLEL.name
    torch.testing.assert_close(logits, naive_logits(checkpoint, parallel=True), rtol=0, atol=1e-10)
    assert not torch.allclose(logits, naive_logits(checkpoint), atol=1e-3)  # not LLaDA's own layout


def test_generate_and_bench_run_it(tree, checkpoint):
    generate_and_bench(tree, str(checkpoint))


def test_generate_split_over_two_processes_gives_its_tokens(tree, checkpoint):
    """Tensor parallelism builds the family's own model on every rank (gloo, float64)."""
    argv = ["generate", "--model", str(checkpoint), "--prompt", "count to 5 .", "--gen-length", "16"]
    argv += ["--block-length", "8", "--dtype", "float64", "--json"]
    split, whole = (json.loads(dllm(tree, *argv, "--tensor-parallel", n)) for n in ("2", "1"))
    assert (split["tensor_parallel"], whole["tensor_parallel"]) == (2, 1)
    assert split["token_ids"] == whole["token_ids"]


def test_serve_answers_with_it(tree, checkpoint, tmp_path):
    serve_answers(tree, str(checkpoint), PARALLEL.served_name, tmp_path)


def test_the_regenerated_crd_chart_and_lists_name_it(tree):
    lists_name_it(tree, PARALLEL)
