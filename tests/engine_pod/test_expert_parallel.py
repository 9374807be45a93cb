"""Expert parallelism (``--expert-parallel``, alone and with ``--tensor-parallel``) for the mixture-of-experts
families on CPUs (gloo, real processes): the tokens of one process through ``dllm generate``, in-process
groups and BlockServe batches (greedy and seeded, float64); each rank's share of the experts; the
collectives a forward makes; and a rank's expert layer running the same operations whatever experts the
tokens chose."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from functools import partial

import pytest
import torch

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.generation import generate_one
from engine_pod.group_processes import ModelArgs, tensor_parallel_group
from engine_pod.loading.loader import load_model
from engine_pod.parallel.place import GroupPlace
from engine_pod.scheduler.blockserve import BlockServeScheduler
from tests.engine_utils import in_process, run_workload
from tests.factories import random_workload

LLADA2, GEMMA = "random:llada2-tiny", "random:diffusion-gemma-tiny"
PROMPT = [5, 17, 33, 8, 101, 64, 12]
TIMEOUT_S = 600  # a bound on a whole command, however slow the machine
SIZES = [(1, 2), (1, 4), (2, 2), (4, 2), (4, 4)]  # (--tensor-parallel, --expert-parallel)
MATRIX = [(model, tensor, expert) for model in (LLADA2, GEMMA) for tensor, expert in SIZES]


def _generate(model: str, tensor: int, expert: int) -> dict:
    """`dllm generate --json` in its own process (one: in this one; DiffusionGemma: a canvas of 32, its noise seeded)."""
    command = [sys.executable, "-m", "engine_pod.cli.main", "generate", "--model", model]
    command += ["--dtype", "float64", "--prompt-ids", ",".join(map(str, PROMPT)), "--threads", "1"]
    command += ["--gen-length", "32", "--seed", "3"] if "gemma" in model else ["--gen-length", "16"]
    command += [] if "gemma" in model else ["--block-length", "8"]
    command += ["--tensor-parallel", str(tensor), "--expert-parallel", str(expert), "--json"]
    if tensor == expert == 1:  # one process: the same command in this one (its torch already loaded)
        code, payload, err = in_process(command[3:])
        assert code == 0, err
        return payload
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("model", "tensor", "expert"),
    [
        (LLADA2, 1, 2),  # CI: the product path at expert-parallel 2 (the others in process below)
        *(pytest.param(m, t, e, marks=pytest.mark.slow) for m, t, e in MATRIX if (m, t, e) != (LLADA2, 1, 2)),
    ],
)
def test_dllm_generate_at_expert_parallel_gives_the_tokens_of_one_process(model, tensor, expert):
    one, group = _generate(model, 1, 1), _generate(model, tensor, expert)
    assert group["expert_parallel"] == expert and group["tensor_parallel"] == tensor
    assert group["token_ids"] == one["token_ids"]
    assert group["num_forward_passes"] == one["num_forward_passes"]


@pytest.mark.parametrize(
    ("model", "tensor", "expert"),
    [(GEMMA, 2, 2), *(pytest.param(LLADA2, t, e, marks=pytest.mark.slow) for t, e in SIZES[:3])],
)
def test_a_seeded_sampled_request_draws_the_same_tokens_at_expert_parallel(model, tensor, expert):
    torch.set_num_threads(1)
    if model == GEMMA:
        decoding, length, sampling = (
            DecodingConfig(block_length=32, steps_per_block=16),
            64,
            RequestParams(seed=5),
        )
    else:
        decoding = DecodingConfig(block_length=8, steps_per_block=4, threshold=0.5, remasking="threshold")
        length, sampling = 16, RequestParams(temperature=0.8, top_p=0.9, seed=7)
    one = generate_one(load_model(model, dtype="float64"), PROMPT, length, decoding, params=sampling)
    place = GroupPlace(tensor, expert=expert)
    with tensor_parallel_group(place, ModelArgs(model, dtype="float64")) as loaded:
        group = generate_one(loaded, PROMPT, length, decoding, params=sampling)
    assert group.token_ids == one.token_ids


@pytest.mark.parametrize(
    ("model", "tensor", "expert"),
    [
        (LLADA2, 1, 2),
        *(pytest.param(m, t, e, marks=pytest.mark.slow) for m, t, e in MATRIX if (m, t, e) != (LLADA2, 1, 2)),
    ],
)
def test_a_blockserve_batch_at_expert_parallel_gives_every_request_the_tokens_of_one_process(
    model, tensor, expert
):
    """Mixed rows leaving at different cycles (LLaDA2.0: threshold decoding; DiffusionGemma: canvases
    stopping at their own steps, each request its own seeded noise)."""
    torch.set_num_threads(1)
    if model == GEMMA:
        block, decoding = 32, DecodingConfig(block_length=32, steps_per_block=16)
        workload = random_workload(random.Random(5), 5, 1024, block, max_prompt=20, max_blocks=2)
    else:
        block = 8
        decoding = DecodingConfig(block_length=8, steps_per_block=8, threshold=0.6, remasking="threshold")
        workload = random_workload(random.Random(3), 10, 1024, block, max_prompt=30, max_blocks=3)
    seeds = {request_id: RequestParams(seed=i + 1) for i, (request_id, _, _) in enumerate(workload)}
    sampling = seeds if model == GEMMA else None
    blockserve = partial(BlockServeScheduler, block, [], SchedulerConfig(token_budget=512), ignore_eos=True)
    one = run_workload(load_model(model, dtype="float64"), blockserve, decoding, workload, sampling=sampling)
    place = GroupPlace(tensor, expert=expert)
    with tensor_parallel_group(place, ModelArgs(model, dtype="float64")) as loaded:
        group = run_workload(loaded, blockserve, decoding, workload, sampling=sampling)
    assert group == one


@pytest.mark.slow
@pytest.mark.timeout((1 + len(SIZES)) * TIMEOUT_S)  # its commands' own bounds govern
@pytest.mark.parametrize("model", [LLADA2, GEMMA])
def test_dllm_bench_at_expert_parallel_answers_every_request_as_one_process(model, tmp_path):
    """BlockServe and static batching through `dllm bench`: each policy's answers hashed, equal at expert
    parallel 2 and 4, alone and with tensor parallelism."""
    digests = {}
    for tensor, expert in [(1, 1), *SIZES]:
        out = tmp_path / f"bench-{tensor}-{expert}.json"
        command = [sys.executable, "-m", "engine_pod.cli.main", "bench", "--model", model]
        command += ["--dtype", "float64", "--workload", "heterogeneous", "--limit", "8"]
        # one thread a process: two on a shared, loaded machine ran one process 10x slower than a group
        command += ["--policy", "static,blockserve", "--no-margins", "--threads", "1"]
        command += ["--tensor-parallel", str(tensor), "--expert-parallel", str(expert), "--json", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        report = json.loads(out.read_text())
        assert (report["tensor_parallel"], report["expert_parallel"]) == (tensor, expert)
        assert report["outputs_identical"]
        if expert > 1:
            assert report["policies"]["blockserve"]["collectives_per_forward"] > 0
        digests[(tensor, expert)] = report["outputs_sha256"]
    assert all(digest == digests[(1, 1)] for digest in digests.values()), digests


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)  # the command's own bound governs (a profile measures 8 shapes)
def test_dllm_profile_at_expert_parallel_records_both_sizes_and_a_budget(tmp_path):
    out = tmp_path / "profile.json"
    command = [sys.executable, "-m", "engine_pod.cli.main", "profile", "--model", LLADA2]
    command += ["--expert-parallel", "2", "--max-tokens", "512", "--memory-limit", str(4 << 30)]
    command += ["--threads", "2", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert (result["tensor_parallel"], result["expert_parallel"]) == (1, 2) and result["token_budget"] > 0
