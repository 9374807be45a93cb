"""Tensor parallelism on CPUs (gloo, real processes): a model split across ranks answers with the tokens
of one process, each rank holds its share of the weights, and the collectives are those the split makes.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from functools import partial

import pytest
import torch

from dllm_contracts.model_source import ModelLoadError
from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.generation import generate_one
from engine_pod.group_processes import ModelArgs, tensor_parallel_group
from engine_pod.loading.loader import load_model
from engine_pod.loading.sharded import load_shard
from engine_pod.parallel.group import TensorParallel
from engine_pod.parallel.place import GroupPlace
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.dllm_serve import DllmServeScheduler
from tests.engine_utils import in_process, run_workload
from tests.factories import random_workload

PROMPT = [5, 17, 33, 8, 101, 64, 12]
SPLIT = ["random:llada-tiny", "random:dream-tiny", "random:llada2-tiny", "random:sdar-tiny"]
TIMEOUT_S = 300  # a bound on a whole `dllm generate` run, however slow the machine


def _generate(model: str, ranks: int, *flags: str) -> tuple[int, dict | None, str]:
    """`dllm generate --json` in its own process (one rank: in this one): exit status, payload, stderr (DiffusionGemma: its canvas is
    its block, its noise seeded)."""
    command = [sys.executable, "-m", "engine_pod.cli.main", "generate", "--model", model]
    command += ["--dtype", "float64", "--prompt-ids", ",".join(map(str, PROMPT))]
    if "gemma" in model:
        command += ["--gen-length", "32", "--seed", "3"]
    else:
        command += ["--gen-length", "16", "--block-length", "8"]
    command += ["--threads", "1", "--tensor-parallel", str(ranks), "--json", *flags]
    if ranks == 1:  # one process: the same command in this one (its torch already loaded)
        return in_process(command[3:])
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=os.environ.copy())
    payload = json.loads(done.stdout) if done.returncode == 0 else None
    return done.returncode, payload, done.stderr


@pytest.mark.parametrize(
    "model",
    [
        *(pytest.param(model, marks=pytest.mark.slow) for model in SPLIT),  # in-process below, in CI
        "builtin:tiny-llada",  # a checkpoint: each tensor cut as it is read
        pytest.param("builtin:tiny-llada2-random", marks=pytest.mark.slow),
        pytest.param("random:diffusion-gemma-tiny", marks=pytest.mark.slow),  # in-process below, in CI
    ],
)
def test_dllm_generate_on_two_ranks_gives_the_tokens_of_one(model):
    """Random presets (drawn whole, then cut) and checkpoints (each tensor cut as it is read)."""
    code, one, err = _generate(model, 1)
    assert code == 0, err
    code, two, err = _generate(model, 2)
    assert code == 0, err
    assert two["token_ids"] == one["token_ids"]
    assert two["num_forward_passes"] == one["num_forward_passes"]


@pytest.mark.parametrize(  # Dream and SDAR (K/V heads shared by ranks, dense block layers) behind -m slow
    "model",
    [*SPLIT[::2], *(pytest.param(model, marks=pytest.mark.slow) for model in SPLIT[1::2])],
    scope="module",  # the tests of one model together, on one shared group
)
def test_a_seeded_sampled_request_draws_the_same_tokens_on_two_ranks(model, shared_group):
    torch.set_num_threads(1)
    decoding = DecodingConfig(block_length=8, steps_per_block=4, threshold=0.5, remasking="threshold")
    sampling = RequestParams(temperature=0.8, top_p=0.9, seed=7)
    one = generate_one(load_model(model, dtype="float64"), PROMPT, 16, decoding, params=sampling)
    two = generate_one(
        shared_group(GroupPlace(2), ModelArgs(model, dtype="float64")), PROMPT, 16, decoding, params=sampling
    )
    assert two.token_ids == one.token_ids


@pytest.mark.slow
@pytest.mark.parametrize("model", [*SPLIT, "random:diffusion-gemma-tiny"])
def test_four_ranks_generate_the_tokens_of_one(model):
    one, four = _generate(model, 1)[1], _generate(model, 4)[1]
    assert four["token_ids"] == one["token_ids"]


def test_a_split_the_model_does_not_divide_is_refused_in_one_line():
    code, _, err = _generate("builtin:tiny-llada", 4)  # 6 heads over 4 ranks
    lines = [line for line in err.strip().splitlines() if "Traceback" in line or "does not divide" in line]
    assert code != 0 and lines and all("Traceback" not in line for line in lines), err


@pytest.mark.parametrize("model", ["random:llada-tiny"], scope="module")  # with the other LLaDA tests
def test_each_rank_holds_its_share_and_a_forward_makes_two_all_reduces_per_layer(model, shared_group):
    torch.set_num_threads(1)
    whole = load_model(model, dtype="float64").model
    decoding = DecodingConfig(block_length=8, steps_per_block=4, cache="dual")
    loaded = shared_group(GroupPlace(2), ModelArgs(model, dtype="float64"))
    held = sum(p.numel() for p in loaded.model.parameters())
    counts = loaded.parallel.counts
    counts.clear()
    result = generate_one(loaded, PROMPT, 16, decoding)
    made = dict(counts)
    layers = len(whole.layers)
    norms = sum(p.numel() for name, p in whole.named_parameters() if "norm" in name)
    assert held <= (sum(p.numel() for p in whole.parameters()) - norms) / 2 + norms
    forwards = result.num_forward_passes
    assert made["all_reduce"] == forwards * (2 * layers + 1)  # o_proj and down_proj per layer, embedding
    cycles = 16 // decoding.block_length
    assert made["broadcast"] == 1 + cycles  # the runner's recipe, then one per cycle
    assert made["all_gather"] >= forwards  # the selected positions' logits, once per LM-head chunk


@pytest.mark.parametrize(  # Dream and SDAR (K/V heads shared by ranks, dense block layers) behind -m slow
    "model",
    [*SPLIT[::2], *(pytest.param(model, marks=pytest.mark.slow) for model in SPLIT[1::2])],
    scope="module",  # the tests of one model together, on one shared group
)
def test_a_blockserve_batch_on_two_ranks_gives_every_request_the_tokens_of_one_process(model, shared_group):
    """Mixed rows, leaving at different cycles and steps (threshold decoding, EOS at a common token)."""
    torch.set_num_threads(1)
    decoding = DecodingConfig(block_length=8, steps_per_block=8, threshold=0.6, remasking="threshold")
    workload = random_workload(random.Random(3), 10, 1024, 8, max_prompt=30, max_blocks=3)
    blockserve = partial(BlockServeScheduler, 8, [], SchedulerConfig(token_budget=512), ignore_eos=True)
    one = run_workload(load_model(model, dtype="float64"), blockserve, decoding, workload)
    two = run_workload(
        shared_group(GroupPlace(2), ModelArgs(model, dtype="float64")), blockserve, decoding, workload
    )
    assert two == one


def test_a_dllm_serve_batch_on_two_ranks_carries_blocks_and_gives_the_tokens_of_one_process(shared_group):
    """dLLM-Serve's staggered refreshes and step-level cycles: every rank carries the same rows' blocks and
    cache entries from one cycle to the next."""
    torch.set_num_threads(1)
    model = "random:dream-tiny"
    decoding = DecodingConfig(block_length=8, steps_per_block=8, threshold=0.6, cache="dual")
    workload = random_workload(random.Random(4), 10, 1024, 8, max_prompt=30, max_blocks=3)
    config = SchedulerConfig(token_budget=512, refresh_quota=0.3, batch_refresh_quota=0.3)
    dllm_serve = partial(DllmServeScheduler, 8, [], config, ignore_eos=True)
    one = run_workload(load_model(model, dtype="float64"), dllm_serve, decoding, workload)
    two = run_workload(
        shared_group(GroupPlace(2), ModelArgs(model, dtype="float64")), dllm_serve, decoding, workload
    )
    assert two == one


@pytest.mark.slow
@pytest.mark.parametrize("model", [*SPLIT, "random:diffusion-gemma-tiny"])
def test_dllm_bench_on_two_and_four_ranks_answers_every_request_as_one_process(model, tmp_path):
    """BlockServe and static batching through `dllm bench`: each policy's answers hashed, equal at 1, 2 and
    4 ranks (DiffusionGemma: its canvas, 32, is the default block length; each request's noise seeded)."""
    digests = {}
    for ranks in (1, 2, 4):
        out = tmp_path / f"bench-{ranks}.json"
        command = [sys.executable, "-m", "engine_pod.cli.main", "bench", "--model", model]
        command += ["--dtype", "float64", "--workload", "heterogeneous", "--limit", "8"]
        command += ["--policy", "static,blockserve", "--no-margins", "--threads", "2"]
        command += ["--tensor-parallel", str(ranks), "--json", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        report = json.loads(out.read_text())
        assert report["tensor_parallel"] == ranks and report["outputs_identical"]
        digests[ranks] = report["outputs_sha256"]
    assert digests[4] == digests[2] == digests[1]


REPEATED = ("norm", ".gate.weight", "expert_bias")  # on every rank whole: norms, routers


@pytest.mark.slow  # per-rank preflight in CI: the memory cap test below
@pytest.mark.parametrize("model", SPLIT)
def test_each_rank_holds_at_most_its_share_of_the_split_weights_plus_the_repeated_ones(model):
    """K/V heads fewer than the ranks are shared by several ranks (each holds one of them)."""
    loaded = load_model(model, dtype="float64")
    config, whole = loaded.config, dict(loaded.model.named_parameters())
    repeated = sum(p.numel() for name, p in whole.items() if any(part in name for part in REPEATED))
    total = sum(p.numel() for p in whole.values())
    kv = (
        config.num_layers * 2 * config.num_kv_heads * config.head_dim * (config.hidden_size + config.qkv_bias)
    )
    for ranks in (2, 4):
        code, payload, err = _generate(model, ranks)
        assert code == 0, err
        held = payload["weights_bytes_per_rank"] // 8  # float64
        share = (total - repeated - kv) / ranks + repeated + kv / min(ranks, config.num_kv_heads)
        assert held <= share, (ranks, held, total)


def test_under_a_memory_cap_a_rank_holds_its_share_and_the_ranks_of_one_machine_are_counted_together(
    monkeypatch,
):
    """A cap the whole model does not fit: refused in one process; a rank's own check judges its share
    (what a GPU rank, on a device of its own, holds); and the two ranks of one CPU machine, which share its
    memory, are refused together before any starts."""
    whole = load_model("builtin:tiny-llada", dtype="float64").weights_bytes  # a checkpoint: cut as read
    monkeypatch.setattr("engine_pod.device_memory.total_memory", lambda device: whole * 3 // 4)
    with pytest.raises(ModelLoadError, match="more than the"):
        load_model("builtin:tiny-llada", dtype="float64")
    rank = load_shard("builtin:tiny-llada", TensorParallel(1, 2), dtype="float64")
    assert rank.weights_bytes <= whole * 3 // 4
    group = tensor_parallel_group(GroupPlace(2), ModelArgs("builtin:tiny-llada", dtype="float64"))
    with pytest.raises(ModelLoadError, match="on each of the 2 ranks on this machine"), group:
        pass


@pytest.mark.slow
def test_dllm_profile_on_two_ranks_records_its_size_and_a_budget(tmp_path):
    out = tmp_path / "profile.json"
    command = [sys.executable, "-m", "engine_pod.cli.main", "profile", "--model", "random:llada-tiny"]
    command += ["--tensor-parallel", "2", "--max-tokens", "1024", "--memory-limit", str(4 << 30)]
    command += ["--threads", "2", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["tensor_parallel"] == 2 and result["token_budget"] > 0


@pytest.mark.slow  # CI runs DiffusionGemma's checkpoint on two ranks (test_tensor_parallel_gemma.py)
def test_diffusion_gemma_blockserve_batch_on_two_ranks_gives_every_request_the_tokens_of_one_process(
    shared_group,
):
    """Canvases stopping at their own steps, each request its own seeded noise."""
    torch.set_num_threads(1)
    model, canvas = "random:diffusion-gemma-tiny", 32
    decoding = DecodingConfig(block_length=canvas, steps_per_block=16)
    workload = random_workload(random.Random(5), 5, 1024, canvas, max_prompt=20, max_blocks=2)
    seeds = {request_id: RequestParams(seed=index + 1) for index, (request_id, _, _) in enumerate(workload)}
    blockserve = partial(BlockServeScheduler, canvas, [], SchedulerConfig(token_budget=1024), ignore_eos=True)
    one = run_workload(load_model(model, dtype="float64"), blockserve, decoding, workload, sampling=seeds)
    loaded = shared_group(GroupPlace(2), ModelArgs(model, dtype="float64"))
    two = run_workload(loaded, blockserve, decoding, workload, sampling=seeds)
    assert two == one
