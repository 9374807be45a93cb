"""``--batch-invariant``: every family's float32 outputs, tokens and log probabilities to the bit, are the
same alone and in any batch (BlockServe packed and dense, static batches), greedy and sampled with a seed;
without it, batches round some request otherwise. ``test_kernel_regimes.py`` runs this file again under
every kernel regime the CPU can be made to run."""

from __future__ import annotations

import json
import random
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.models.batch_invariant import (
    BatchInvariantLinear,
    apply_matmul_settings,
    arm,
    matmul_settings,
    set_batch_invariant,
)
from engine_pod.models.row_invariant import RowInvariantLinear, linear
from engine_pod.parallel.group import SINGLE
from engine_pod.parallel.layers import RowParallelLinear, VocabParallelHead
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.dllm_serve import DllmServeScheduler
from engine_pod.scheduler.static import StaticScheduler, sequential_scheduler
from tests.engine_utils import run_workload_logprobs

FAMILIES = ("llada", "dream", "llada2", "sdar", "diffusion-gemma")
PROMPT_LENGTHS = (1, 2, 3, 13, 40, 21)  # 1-3 tokens: fewer rows than a matrix kernel's


@pytest.fixture(scope="module")
def models():
    return {}


def _loaded(models: dict, family: str):
    if family not in models:
        models[family] = load_model(f"random:{family}-tiny")
    return models[family]


def _outputs(loaded, family: str, on: bool) -> dict[str, dict]:
    """Each request's (tokens, log probabilities) alone and in BlockServe's and static batches, packed and
    dense, the batches' requests arriving in another order."""
    canvas = family == "diffusion-gemma"  # its blocks are canvases of the preset's length
    block = 32 if canvas else 8
    rng = random.Random(5)
    workload = [
        (f"r{i}", [rng.randrange(3, 999) for _ in range(n)], block * rng.randint(1, 2))
        for i, n in enumerate(PROMPT_LENGTHS)
    ]
    if canvas:  # its canvases start from noise drawn with each request's seed
        sampling = {rid: RequestParams(seed=i) for i, (rid, _, _) in enumerate(workload)}
        logprobs = None  # its sampler records none
    else:
        sampling = {
            "r1": RequestParams(temperature=0.9, seed=11),
            "r3": RequestParams(temperature=0.7, top_k=20, seed=4),
        }
        logprobs = {rid: 2 for rid, _, _ in workload}
    decoding = DecodingConfig(
        block_length=block,
        steps_per_block=32 if canvas else 4,
        remasking="threshold" if canvas else "low_confidence",
        batch_invariant=on,
    )
    run = partial(run_workload_logprobs, loaded, decoding=decoding, workload=workload, sampling=sampling)
    run = partial(run, logprobs=logprobs)
    order = [3, 0, 5, 1, 4, 2]
    outputs = {"alone": run(partial(sequential_scheduler, block, [], layout="dense"))}
    for layout in ("packed", "dense"):
        budget = SchedulerConfig(token_budget=300, layout=layout)
        outputs[f"blockserve-{layout}"] = run(partial(BlockServeScheduler, block, [], budget), order=order)
        static = partial(StaticScheduler, block, [], batch_size=4, layout=layout)
        outputs[f"static-{layout}"] = run(static, order=order)
    assert not logprobs or all(values for _, values in outputs["alone"].values())  # log probabilities came
    return outputs


@pytest.fixture
def plain_products(monkeypatch) -> list[str]:
    """The library's plain matrix products (F.linear, torch.matmul) called on rows while it is in use."""
    calls: list[str] = []

    def spy(name: str, original):
        def counted(x, *args, **kwargs):
            if x.numel():
                calls.append(name)
            return original(x, *args, **kwargs)

        return counted

    for owner, name in ((F, "linear"), (torch, "matmul")):
        monkeypatch.setattr(owner, name, spy(name, getattr(owner, name)))
    return calls


@pytest.mark.parametrize("family", FAMILIES)
def test_a_requests_float32_outputs_are_the_same_bits_alone_and_in_any_batch(models, family, plain_products):
    """And no layer multiplies its rows otherwise than through row_invariant.linear's tiles."""
    loaded = _loaded(models, family)
    outputs = _outputs(loaded, family, on=True)
    assert not plain_products, f"{family}: {sorted(set(plain_products))} called under the setting"
    alone = outputs.pop("alone")
    for batching, got in outputs.items():
        assert got == alone, f"{family}, {batching}: {[rid for rid in alone if got[rid] != alone[rid]]}"


VARIANTS = {
    "candidates": {"logit_candidates": 16},
    "chunked logits": {"max_materialized_logits": 3},
    "head-sparse cache": {"sparse": HeadSparseConfig(mode="uniform", retention=0.5)},
    "no cache": {"cache": "none"},
    "prefix cache": {"cache": "prefix"},
    "masked suffix": {"masked_suffix": True},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_decoding_variants_keep_a_requests_bits_under_the_setting(models, variant, plain_products):
    """LLaDA's other paths (the bfloat16 candidates' scores, the head-sparse cache's attention, forwards
    without a dual cache, the masked suffix of --canvas full): a request's tokens and log probabilities alone and in
    BlockServe's batches."""
    loaded = _loaded(models, "llada")
    rng = random.Random(7)
    workload = [
        (f"r{i}", [rng.randrange(3, 999) for _ in range(n)], 16) for i, n in enumerate(PROMPT_LENGTHS)
    ]
    decoding = DecodingConfig(
        block_length=8,
        steps_per_block=4,
        remasking="low_confidence",
        batch_invariant=True,
        **VARIANTS[variant],
    )
    sampling = {"r2": RequestParams(temperature=0.8, seed=3)}
    run = partial(run_workload_logprobs, loaded, decoding=decoding, workload=workload, sampling=sampling)
    run = partial(run, logprobs={rid: 1 for rid, _, _ in workload})
    alone = run(partial(sequential_scheduler, 8, [], layout="dense"))
    for layout in ("packed", "dense"):
        budget = SchedulerConfig(token_budget=300, layout=layout)
        got = run(partial(BlockServeScheduler, 8, [], budget), order=[3, 0, 5, 1, 4, 2])
        assert got == alone, f"{variant}, {layout}: {[rid for rid in alone if got[rid] != alone[rid]]}"
    assert not plain_products, f"{variant}: {sorted(set(plain_products))} called under the setting"


def test_dllm_serves_staggered_refreshes_keep_a_requests_bits_under_the_setting(models):
    """dLLM-Serve's batches (each step's refreshes held to a quota, rows refreshed every second forward)
    against each request alone under the same policy. (Without the setting these batches round alike on
    an AMD EPYC too: this guards the policy's path through the setting, not the setting's need.)"""
    loaded = _loaded(models, "llada")
    rng = random.Random(5)
    workload = [
        (f"r{i}", [rng.randrange(3, 999) for _ in range(n)], 16) for i, n in enumerate(PROMPT_LENGTHS)
    ]
    decoding = DecodingConfig(block_length=8, steps_per_block=4, threshold=0.5, batch_invariant=True)
    scheduler = partial(DllmServeScheduler, 8, [], SchedulerConfig(token_budget=300, refresh_interval=2))
    run = partial(run_workload_logprobs, loaded, scheduler, decoding)
    logprobs = {rid: 1 for rid, _, _ in workload}
    alone = {}
    for item in workload:
        alone |= run([item], logprobs=logprobs)
    assert run(workload, order=[3, 0, 5, 1, 4, 2], logprobs=logprobs) == alone


def test_without_the_setting_a_batch_rounds_some_request_otherwise(models):
    """What the setting prevents is there: LLaDA2.0's batches (its experts' groups of a few rows, the
    dense box's padding) round some request's log probabilities otherwise than alone."""
    outputs = _outputs(_loaded(models, "llada2"), "llada2", on=False)
    alone = outputs.pop("alone")
    differ = {batching for batching, got in outputs.items() if got != alone}
    assert differ, "every batch gave every request its bits alone without the setting"


def test_the_setting_swaps_every_linear_layers_product_and_back():
    model = nn.ModuleDict(
        {
            "plain": nn.Linear(64, 32),
            "row_parallel": RowParallelLinear(64, 32, SINGLE),
            "head": VocabParallelHead(64, 40, 37, SINGLE),
            "own": RowInvariantLinear(64, 32),  # a family's own (DiffusionGemma's): row-invariant always
        }
    )
    before = {name: p.data_ptr() for name, p in model.named_parameters()}
    x = torch.randn(3, 64)
    set_batch_invariant(model, True)
    assert all(isinstance(module, RowInvariantLinear) for module in model.values())
    assert isinstance(model["row_parallel"], RowParallelLinear) and isinstance(
        model["head"], VocabParallelHead
    )
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == before  # nothing copied
    plain = model["plain"]
    assert torch.equal(plain(x), linear(x, plain.weight, plain.bias))
    assert torch.equal(model["row_parallel"](x), linear(x, model["row_parallel"].weight))
    assert torch.equal(model["head"](x), linear(x, model["head"].weight)[:, :37])
    set_batch_invariant(model, False)
    assert [type(module) for module in model.values()] == [
        nn.Linear,
        RowParallelLinear,
        VocabParallelHead,
        RowInvariantLinear,
    ]
    assert not any(isinstance(module, BatchInvariantLinear) for module in model.values())
    assert torch.equal(model["plain"](x), F.linear(x, plain.weight, plain.bias))


def test_cuda_keeps_full_precision_reductions_under_the_setting():
    assert matmul_settings("cpu", True) == {} and matmul_settings(torch.device("cpu"), False) == {}
    on, off = matmul_settings("cuda:1", True), matmul_settings("cuda", False)
    assert on == {
        "fp32_precision": "ieee",
        "allow_fp16_reduced_precision_reduction": (False, False),
        "allow_bf16_reduced_precision_reduction": (False, False),
    }
    assert off["fp32_precision"] == "none" and off["allow_bf16_reduced_precision_reduction"] == (True, True)
    cublas = torch.backends.cuda.matmul  # a process setting, settable without a GPU
    saved = {name: getattr(cublas, name) for name in ("fp32_precision", *sorted(on)[:2])}
    try:
        apply_matmul_settings("cuda", True)
        assert cublas.fp32_precision == "ieee" and not cublas.allow_tf32
        assert not cublas.allow_bf16_reduced_precision_reduction
        assert not cublas.allow_fp16_reduced_precision_reduction_split_k
        apply_matmul_settings("cuda", False)
        assert cublas.allow_fp16_reduced_precision_reduction and cublas.allow_bf16_reduced_precision_reduction
    finally:
        for name, value in saved.items():
            setattr(cublas, name, value)


def test_a_model_that_never_had_the_setting_leaves_the_process_cuda_settings_alone():
    cublas = torch.backends.cuda.matmul
    saved = cublas.allow_bf16_reduced_precision_reduction
    try:
        cublas.allow_bf16_reduced_precision_reduction = False  # someone else's choice
        arm(nn.Linear(4, 4), "cuda", False)
        assert not cublas.allow_bf16_reduced_precision_reduction
    finally:
        cublas.allow_bf16_reduced_precision_reduction = saved


def test_dllm_bench_runs_every_policy_with_the_setting_and_without(tmp_path, capsys):
    """The product path: `dllm bench --batch-invariant on,off` in float32, each policy both ways in one run:
    with the setting its batches (static's dense box among them) give every request the tokens it gets
    alone, and each run with it is measured against its run without."""
    from engine_pod.cli.bench_summary import _decoding_line
    from engine_pod.cli.main import build_parser, main

    out = tmp_path / "bench.json"
    argv = ["bench", "--model", "random:llada2-tiny", "--batch-invariant", "on,off", "--threads", "1"]
    argv += ["--policy", "sequential,static,blockserve,blockserve-dense", "--json", str(out), "--no-isolate"]
    argv += ["--workload", "synthetic:n=6,prompt=1-40,gen=8-16,seed=0", "--block-length", "8"]
    assert main([*argv, "--steps-per-block", "4", "--remasking", "low_confidence"]) == 0
    report = json.loads(out.read_text())
    assert report["dtype"] == "float32" and report["batch_invariant"] == ["on", "off"]
    invariant = [name for name in report["policies"] if name.endswith("/batch-invariant-on")]
    assert len(invariant) == 4 and len(report["policies"]) == 8
    assert len({report["outputs_sha256"][name] for name in invariant}) == 1  # every policy's tokens alike
    for name in invariant:
        ratio = report["policies"][name]["vs_batch_invariant_off"]
        off = report["policies"][name.replace("-on", "-off")]["tokens_per_s"]
        assert ratio == pytest.approx(report["policies"][name]["tokens_per_s"] / off, rel=1e-2)
    assert (
        "every policy with batch-invariant products (every batch packed) and without"
        in capsys.readouterr().out
    )
    one_way = {"batch_invariant": ["on"], "decoding": {"threshold": 0.9}}
    assert _decoding_line(one_way) == "threshold 0.9; batch-invariant products, every batch packed"
    assert build_parser().parse_args(["bench", "--batch-invariant"]).batch_invariant == (True,)
    assert build_parser().parse_args(["bench"]).batch_invariant == (False,)


def test_dllm_serve_hands_the_setting_to_its_worker():
    from engine_pod.cli.main import build_parser
    from engine_pod.cli.serve import _worker_args
    from tests.engine_pod.test_cli_threads import IDENTITY

    def worker(*flags: str):
        given = build_parser().parse_args(["serve", "--token-budget", "4096", *flags])
        given.service = "default"
        return build_parser().parse_args(["worker", *_worker_args(given, "redis://127.0.0.1:1/0", IDENTITY)])

    assert worker("--batch-invariant").batch_invariant == (True,) and worker().batch_invariant == (False,)


@pytest.mark.parametrize("command", ["worker", "serve", "profile"])
def test_a_command_that_runs_one_way_takes_on_or_off_and_refuses_both_in_one_line(command):
    """``--batch-invariant on|off`` on the commands that run one way; ``on,off`` (a benchmark's) or a typo
    ends with one error line naming the flag, exit status 2, no traceback."""
    import os
    import subprocess
    import sys

    from engine_pod.cli.main import build_parser

    required = ["--redis", "redis://127.0.0.1:1/0", "--service", "s"] if command == "worker" else []
    parse = build_parser().parse_args
    assert parse([command, *required, "--batch-invariant", "off"]).batch_invariant == (False,)
    assert parse([command, *required, "--batch-invariant", "on"]).batch_invariant == (True,)
    env = os.environ | {"DLLM_NO_HUGE_PAGES": "1"}
    for value in ("on,off", "yes"):
        argv = [sys.executable, "-m", "engine_pod.cli.main", command, *required, "--batch-invariant", value]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert last == f"dllm {command}: error: argument --batch-invariant: expected on or off; got {value!r}"
