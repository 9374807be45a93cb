"""Which positions a head keeps, beside our scoring: the block's mean query's pre-softmax logits (the most
over a K/V head's query heads), pooling over neighbouring context positions, one set shared by a layer's
heads, and a selection delay (the block's first forwards full, the selection at the one after them)."""

from __future__ import annotations

import pytest
import torch

from dllm_contracts.head_sparse_config import HeadSparseConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.kinds.bidirectional import stepper as stepper_module
from engine_pod.kinds.bidirectional.head_sparse import store as store_module
from engine_pod.kinds.bidirectional.head_sparse.scores import pooled, selection_scores
from engine_pod.loading.loader import load_model
from engine_pod.prompts import encode_prompt
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.synthetic.tasks import eval_set


def _inputs(seed: int = 0):
    """Two rows of 3 queries (the second with 2 real) over 4 query heads, 2 K/V heads, 6 keys (the
    second row's last 2 not its own)."""
    g = torch.Generator().manual_seed(seed)
    queries = torch.randn(2, 3, 4, 8, generator=g, dtype=torch.float64)
    keys = torch.randn(2, 6, 2, 8, generator=g, dtype=torch.float64)
    q_valid = torch.tensor([[True] * 3, [True, True, False]])
    k_valid = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    return queries, q_valid, keys, k_valid


def test_mean_query_logit_is_the_mean_querys_logit_the_most_over_a_kv_heads_query_heads():
    queries, q_valid, keys, k_valid = _inputs()
    scores = selection_scores(queries, q_valid, keys, k_valid, 0.5, "mean-query-logit", shared=False)
    for r in range(2):
        mean = queries[r, q_valid[r]].mean(0)  # [4, 8]
        for h in range(2):
            for k in range(6):
                expected = max(float(mean[h * 2 + i] @ keys[r, k, h]) * 0.5 for i in range(2))
                expected = expected if k_valid[r, k] else 0.0
                assert scores[r, h, k].item() == pytest.approx(expected)


@pytest.mark.parametrize("scoring", ["probability", "mean-query-logit"])
def test_a_shared_selection_ranks_every_head_by_one_score_summed_over_the_query_heads(scoring):
    queries, q_valid, keys, k_valid = _inputs(1)
    shared = selection_scores(queries, q_valid, keys, k_valid, 0.5, scoring, shared=True)
    assert torch.equal(shared[:, 0], shared[:, 1])
    if scoring == "probability":  # the per-head scores already sum a K/V head's query heads
        per_head = selection_scores(queries, q_valid, keys, k_valid, 0.5, scoring, shared=False)
        assert torch.allclose(shared[:, 0], per_head.sum(1))
    else:
        mean = torch.stack([queries[r, q_valid[r]].mean(0) for r in range(2)])  # [R, 4, 8]
        kv = keys.repeat_interleave(2, dim=2)  # each query head's K/V head
        expected = torch.einsum("rhd,rkhd->rk", mean, kv) * 0.5
        assert torch.allclose(shared[:, 0], expected.masked_fill(~k_valid, 0.0))


def test_pooling_takes_the_most_within_the_kernel_over_context_positions_only():
    scores = torch.tensor([[[1.0, 5.0, 2.0, 9.0, 9.0, 0.0, 3.0, 0.5]]])
    block = torch.tensor([[False, False, False, True, True, False, False, False]])
    valid = torch.tensor([[True] * 7 + [False]])
    out = pooled(scores, valid & ~block, 3)
    # context 0..2 and 5..6: each its neighbours' most among context; the block (9s) lends nothing
    assert out[0, 0].tolist() == [5.0, 5.0, 5.0, 9.0, 9.0, 3.0, 3.0, 0.5]
    assert torch.equal(pooled(scores, valid & ~block, 1), scores)


@pytest.fixture(scope="module")
def loaded():
    return load_model("builtin:tiny-llada")


def _prompts(loaded, n: int = 3) -> list[list[int]]:
    return [encode_prompt(loaded.tokenizer, e.prompt, chat=True) * 3 for e in eval_set(n, seed=5)]


@pytest.mark.parametrize("delay", [0, 1, 3])
def test_a_blockserve_cycle_selects_once_after_its_delays_full_forwards(loaded, delay, monkeypatch):
    """The block's first ``delay`` forwards compute every position and keep nothing; the one after them
    selects, over every row of the cycle; the window forwards after it read what it kept."""
    sparse = HeadSparseConfig(mode="uniform", retention=0.3, selection_delay=delay)
    runner = make_runner(loaded, DecodingConfig(remasking="low_confidence", sparse=sparse), record_trace=True)
    stepper = runner.stepper
    seen = []
    real = stepper_module.refresh_heads

    def spy(box, cache, picked, layers):
        seen.append((len(stepper.trace), len(picked)))
        return real(box, cache, picked, layers)

    monkeypatch.setattr(stepper_module, "refresh_heads", spy)
    rows = [CycleRow(tuple(p)) for p in _prompts(loaded)]
    stats = runner.run(SchedulerOutput.of_rows(rows, packed=True)).stats
    kinds = [entry["kind"] for entry in stepper.trace]
    assert seen == [(delay, len(rows))]  # one selection, after ``delay`` forwards, of every row
    assert kinds[: delay + 1] == ["full"] * (delay + 1) and "full" not in kinds[delay + 1 :]
    assert len(kinds) > delay + 1  # windows read the kept entries
    assert 0 < stats.kv_kept_bytes < stats.kv_dense_bytes  # counted once, at the selecting refresh
    assert stats.kv_dense_bytes == sum(len(p) + 32 for p in _prompts(loaded)) * stepper.position_bytes


@pytest.mark.parametrize("selection", ["per-head", "shared"])
def test_a_shared_selection_keeps_one_set_for_every_head(loaded, selection, monkeypatch):
    kept = []
    real = store_module.kept_positions

    def spy(*args):
        positions = real(*args)
        kept.append(positions)
        return positions

    monkeypatch.setattr(store_module, "kept_positions", spy)
    sparse = HeadSparseConfig(mode="uniform", retention=0.3, selection=selection, scoring="mean-query-logit")
    runner = make_runner(loaded, DecodingConfig(remasking="low_confidence", sparse=sparse))
    runner.run(SchedulerOutput.of_rows([CycleRow(tuple(p)) for p in _prompts(loaded)], packed=True))
    same = [bool((positions == positions[:, :1]).all()) for positions in kept]  # [R, Hg, kept]
    assert kept and (all(same) if selection == "shared" else not all(same))
