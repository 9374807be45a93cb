"""The op census's grid: every family (and Dream's timestep schedule beside threshold decoding), static
batching and BlockServe (packed and dense), greedy, sampled and log-probability requests, with rows leaving
the cycle's forwards at different steps and a request ending after each cycle: every forward attends once
per layer and reads nothing, every denoising step reads the device at most once, a cycle copies host data
to the device at most twice (the varlen kernel's metadata included: derived on the device), and packed
forwards make no new attention shapes after the first cycle (dense ones at most 4). CI runs every family's packed forwards
with each kind of request and static and dense batching with sampled requests; ``-m slow`` the rest."""

from __future__ import annotations

import pytest

from engine_pod.bench.census_grid import MODELS, REMASKINGS, REQUESTS
from engine_pod.decoding.grammar import rows as grammar_rows
from tests.engine_pod.test_op_census import census_figures, census_models


@pytest.fixture(scope="module")
def models():
    return census_models()


def _marks(policy: str, requests: str) -> list:
    """CI's share of the grid: packed with every kind of request, static and dense with sampled ones."""
    return [] if policy == "blockserve-packed" or requests == "sampled" else [pytest.mark.slow]


PLAIN = [kind for kind in REQUESTS if kind != "constrained"]  # constrained rows: their own bounds, below
GRID = [
    pytest.param(spec, policy, requests, remasking, marks=_marks(policy, requests))
    for spec in MODELS
    for remasking in REMASKINGS.get(spec, ("threshold",))
    for policy in ("static", "blockserve-packed", "blockserve-dense")
    for requests in PLAIN
]


@pytest.mark.parametrize(("spec", "policy", "requests", "remasking"), GRID)
def test_every_forward_attends_once_per_layer_and_every_step_reads_at_most_once(
    models, spec, policy, requests, remasking
):
    """Rows with their own thresholds leave the cycle's forwards at different steps; a request ends after
    each cycle; greedy, sampled (top-k, top-p, a seed per row) and log-probability requests alike."""
    figures = census_figures(models[spec], spec, policy, requests, remasking)
    assert figures.attention_calls_per_layer == 1
    assert figures.syncs_per_forward == 0, figures.sync_kinds
    assert figures.syncs_per_step <= 1, figures.sync_kinds
    assert figures.host_to_device_per_cycle <= 2  # the varlen kernel's metadata included
    assert figures.new_attention_shapes <= (0 if policy == "blockserve-packed" else 4)


CI_STAGGERED = {("random:dream-tiny", "sampled")}
STAGGERED_GRID = [
    pytest.param(spec, requests, marks=[] if (spec, requests) in CI_STAGGERED else [pytest.mark.slow])
    for spec in ("random:llada-tiny", "random:dream-tiny")
    for requests in PLAIN
]


def _packed_bounds(figures) -> None:
    """A packed cycle's bounds: one attention call per layer, no read in a forward, at most one per step,
    two copies per cycle, no new attention shape."""
    assert figures.attention_calls_per_layer == 1
    assert figures.syncs_per_forward == 0, figures.sync_kinds
    assert figures.syncs_per_step <= 1, figures.sync_kinds
    assert figures.host_to_device_per_cycle <= 2
    assert figures.new_attention_shapes == 0


@pytest.mark.parametrize(("spec", "requests"), STAGGERED_GRID)
def test_staggered_refreshes_attend_once_per_layer_read_once_per_step_and_copy_twice_per_cycle(
    models, spec, requests
):
    """dLLM-Serve's cycles (a quota of 0.3 of the rows' positions per step): refreshing and reusing rows
    share each step's one forward, the step's plan is made on the device and read with the step's one read:
    a plain cycle's two copies, whatever the steps the refreshes are spread over."""
    figures = census_figures(models[spec], spec, "dllm-serve", requests)
    _packed_bounds(figures)
    plain = census_figures(models[spec], spec, "blockserve-packed", requests)
    assert figures.forwards > plain.forwards  # the refreshes were spread: rows waited for their turn


@pytest.mark.parametrize("requests", ["greedy", "logprobs"])
def test_step_level_cycles_carry_rows_without_a_copy_or_a_read_more(models, requests):
    """dLLM-Serve's step-level cycles: a cycle ends once a row's block is complete, and the rows going on
    carry their blocks and caches into the next one, laid out by that cycle's one copy (the carried caches
    move on the device): the same bounds as every cycle."""
    spec = "random:llada-tiny"
    figures = census_figures(models[spec], spec, "dllm-serve-step-level", requests)
    _packed_bounds(figures)
    block_level = census_figures(models[spec], spec, "dllm-serve", requests)
    assert figures.forwards < block_level.forwards  # its cycles ended at a step: rows were carried


CONSTRAINED_GRID = [
    pytest.param(spec, policy, marks=[] if policy == "blockserve-packed" else [pytest.mark.slow])
    for spec in MODELS
    for policy in ("blockserve-packed", "static", "blockserve-dense")
    + (("dllm-serve", "dllm-serve-step-level") if spec in ("random:llada-tiny", "random:dream-tiny") else ())
]


@pytest.mark.parametrize(("spec", "policy"), CONSTRAINED_GRID)
def test_constrained_rows_read_once_per_step_and_copy_their_masks_once_per_step(models, spec, policy):
    """Every other row's answer keeps to a JSON schema (structured outputs): the grammar's report rides each
    step's one read, and each step's masks and the host's commits go to the device in one copy more than a
    free cycle makes between two forwards."""
    figures = census_figures(models[spec], spec, policy, "constrained")
    free = census_figures(models[spec], spec, policy, "greedy")
    assert figures.attention_calls_per_layer == 1
    assert figures.syncs_per_forward == 0, figures.sync_kinds
    assert figures.syncs_per_step <= 1, figures.sync_kinds
    assert figures.host_to_device_per_step <= free.host_to_device_per_step + 1
    assert figures.new_attention_shapes <= (0 if policy.startswith(("blockserve-packed", "dllm")) else 4)


def test_a_second_copy_planted_in_the_grammars_step_is_counted(models, monkeypatch):
    send = grammar_rows.ConstrainedRows.send

    def twice(self, *args, **kwargs):
        self.buffers.send({"planted": [1]})  # a second copy in the step
        self.buffers.send({"again": [2]})
        return send(self, *args, **kwargs)

    monkeypatch.setattr(grammar_rows.ConstrainedRows, "send", twice)
    spec = "random:llada-tiny"
    figures = census_figures(models[spec], spec, "blockserve-packed", "constrained")
    assert figures.host_to_device_per_step >= 2
