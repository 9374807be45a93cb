"""The prefix cache's workloads in ``dllm bench``, ``--prefix-cache on,off`` in one run, and admission that
counts the blocks a batch shares once."""

from __future__ import annotations

import json

import pytest

from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.bench.prepare import prepare_requests
from engine_pod.bench.workloads import WorkloadError, load_workload
from engine_pod.cli.main import main
from engine_pod.loading.loader import load_metadata
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.request import Request
from tests.engine_utils import tokens
from tests.serving_utils import write_served_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_served_model(tmp_path_factory.mktemp("prefix-model") / "tiny-llada2", family="llada2")


def test_the_shared_prefix_and_multi_turn_workloads_have_the_shapes_they_name(model):
    shared = load_workload("shared-prefix")
    assert len(shared) == 64 and all(item.shared_prefix_tokens == 1024 for item in shared)
    assert all(16 <= item.prompt_tokens <= 64 and 32 <= item.max_tokens <= 64 for item in shared)
    config, tokenizer = load_metadata(str(model))
    prepared = prepare_requests(shared, config, tokenizer)
    assert len({tuple(r.prompt_ids[:1024]) for r in prepared}) == 1
    assert len({tuple(r.prompt_ids[1024:]) for r in prepared}) == 64
    chats = load_workload("multi-turn")
    assert len(chats) == 64 and sum(item.follows is None for item in chats) == 16
    turns = prepare_requests(chats, config, tokenizer)
    assert turns[1].follows == turns[0].request_id and turns[1].history_tokens > len(turns[0].prompt_ids)
    with pytest.raises(WorkloadError, match="turns"):
        load_workload("multi-turn:turns=0")


def test_bench_compares_the_prefix_cache_on_and_off_with_identical_outputs(model, tmp_path):
    for workload in (
        "shared-prefix:n=6,prefix=64,question=4-12,gen=8-16",
        "multi-turn:conversations=2,turns=3",
    ):
        out = tmp_path / "b.json"
        argv = ["bench", "--model", str(model), "--dtype", "float64", "--workload", workload, "--no-isolate"]
        argv += ["--policy", "blockserve", "--prefix-cache", "on,off", "--block-length", "8"]
        argv += ["--steps-per-block", "8", "--token-budget", "2048", "--json", str(out)]
        assert main(argv) == 0
        report = json.loads(out.read_text())
        on, off = (report["policies"][f"blockserve/prefix-cache-{s}"] for s in ("on", "off"))
        assert on["requests"] == off["requests"] == (6 if workload.startswith("shared") else 6)
        assert report["outputs_identical"] is True
        assert on["vs_prefix_cache_off"] == pytest.approx(on["tokens_per_s"] / off["tokens_per_s"], rel=1e-2)


def _request(request_id: str, prompt: list[int]) -> Request:
    return Request.from_tokens(request_id, prompt, tokens(8), 8, grid_aligned=True)


def test_admission_counts_the_blocks_a_batch_shares_once():
    """Four requests with 64 common tokens and 4 of their own: 4 x (64 + 8) = 288 tokens unshared, 64 + 4 x
    8 = 96 shared (the active blocks hold the 4 own tokens)."""
    prefix = list(range(64))
    requests = [_request(f"r{i}", prefix + [100 + i] * 4) for i in range(4)]
    admitted = {}
    for shares in (False, True):
        scheduling = SchedulerConfig(token_budget=150, max_wait_s=0)
        scheduler = BlockServeScheduler(8, [], scheduling, grid_aligned=True, shares_blocks=shares)
        for request in requests:
            scheduler.add(_request(request.request_id, list(request.prompt_ids)))
        output = scheduler.schedule()
        admitted[shares] = len(output.rows)
        assert output.cost <= 150
    assert admitted == {False: 2, True: 4}
