"""DiffusionGemma split across ranks (families/diffusion_gemma/shards.py; gloo, real processes): the
collectives a forward and a cycle make, each rank's share of the weights, and a checkpoint read as each
rank's slices only."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from dllm_contracts.model_source import ModelLoadError
from dllm_contracts.request_params import RequestParams
from engine_pod.decoding.config import DecodingConfig
from engine_pod.families.diffusion_gemma import weights
from engine_pod.generation import generate_one
from engine_pod.group_processes import ModelArgs, tensor_parallel_group
from engine_pod.loading.loader import load_model
from engine_pod.loading.sharded import load_shard
from engine_pod.parallel.cuts import CHUNK_BYTES
from engine_pod.parallel.group import TensorParallel
from engine_pod.parallel.place import GroupPlace

MODEL = "random:diffusion-gemma-tiny"
PROMPT = [5, 17, 33, 8, 101, 64, 12]
CANVAS = 32
CHECKPOINT = Path(__file__).resolve().parents[1] / "data" / "diffusion_gemma_reference"  # vision tower too
TIMEOUT_S = 300  # a bound on a whole `dllm generate` run, however slow the machine

_SPLIT = re.compile(r"(encoder_)?layers\.\d+\.(self_attn\.[qo]_proj|mlp|experts)\..*")
_KV = re.compile(r"(?:encoder_)?layers\.(\d+)\.self_attn\.[kv]_proj\..*")
_VOCAB = ("embed_tokens.weight", "encoder_embed_tokens.weight", "lm_head.weight")


def share_of(ranks: int, model: str = MODEL) -> tuple[int, int]:
    """(the most parameters one of ``ranks`` ranks may hold, the whole model's): a 1/N share of the query
    and output heads, the dense MLP and every expert; of each layer's K/V heads a 1/N share, or one head
    where the layer has fewer K/V heads than ranks; ceil(V/N) rows of each vocabulary table; the rest
    (norms, routers, the self-conditioning MLP) whole."""
    loaded = load_model(model, dtype="float64")
    config, share, total = loaded.config, 0.0, 0
    for name, parameter in loaded.model.named_parameters():
        total += parameter.numel()
        if name in _VOCAB:
            share += math.ceil(config.vocab_size / ranks) * parameter.shape[1]
        elif found := _KV.fullmatch(name):
            heads = config.layer_kv_heads[int(found.group(1))]
            share += parameter.numel() / min(ranks, heads)
        elif _SPLIT.fullmatch(name):
            share += parameter.numel() / ranks
        else:
            share += parameter.numel()
    return int(share), total


class _Calls:
    """How often rank 0's model encodes, denoises and makes soft embeddings (the follower does the same)."""

    def __init__(self, model) -> None:
        self.counts: Counter = Counter()
        for name in ("_encode", "denoise", "soft_embeddings"):
            setattr(model, name, self._counted(name, getattr(model, name)))

    def _counted(self, name: str, method):
        def call(*args, **kwargs):
            self.counts[name] += 1
            return method(*args, **kwargs)

        return call


def test_a_diffusion_gemma_checkpoint_on_two_ranks_its_tokens_collectives_and_share():
    """A checkpoint (each tensor cut as it is read) on two ranks: the tokens of one process, each rank at
    most its share of the weights, and these collectives. Per decoder forward 1 + 3L all-reduces (L
    layers): the embedding's lookup over the vocabulary's runs, then per layer the attention's output
    (o_proj), the dense MLP's and the experts' (Gemma's sandwich norms normalise each before they meet, so
    each is summed on its own); per encoder forward three fewer (its last layer only writes its keys and
    values: its output is never read). A decoder forward also gathers its logits along the
    vocabulary (one all-gather), and each of its steps but a canvas's last sums the soft embeddings'
    product over the vocabulary (one all-reduce). Per cycle: one broadcast (the cycle), one encoder
    forward (the prompt, then each committed canvas); the runner's recipe is one broadcast more. Nothing
    else (no max, no other collective)."""
    torch.set_num_threads(1)
    spec, canvas, sampling = str(CHECKPOINT), 16, RequestParams(seed=3)  # its config's canvas_length
    decoding, tokens = DecodingConfig(block_length=canvas, steps_per_block=8), 2 * canvas
    one = generate_one(load_model(spec, dtype="float64"), PROMPT, tokens, decoding, params=sampling)
    most, whole = share_of(2, spec)
    with tensor_parallel_group(GroupPlace(2), ModelArgs(spec, dtype="float64")) as loaded:
        held = sum(p.numel() for p in loaded.model.parameters())
        calls = _Calls(loaded.model)
        loaded.parallel.counts.clear()
        result = generate_one(loaded, PROMPT, tokens, decoding, params=sampling)
        made, layers = dict(loaded.parallel.counts), loaded.config.num_layers
    assert result.token_ids == one.token_ids
    assert held <= most < whole * 0.75, (held, most, whole)
    cycles, called = tokens // canvas, calls.counts
    encodes, denoises, softs = called["_encode"], called["denoise"], called["soft_embeddings"]
    assert (encodes, denoises, softs) == (cycles, result.num_forward_passes, denoises - cycles)
    assert denoises > 2 * cycles, "every canvas stopped at its first step: the test proves little"
    assert made == {
        "all_reduce": encodes * (1 + 3 * (layers - 1)) + denoises * (1 + 3 * layers) + softs,
        "all_gather": denoises,
        "broadcast": 1 + cycles,
    }


def _generate(ranks: int) -> dict:
    command = [
        sys.executable,
        "-m",
        "engine_pod.cli.main",
        "generate",
        "--model",
        MODEL,
        "--dtype",
        "float64",
    ]
    command += ["--prompt-ids", ",".join(map(str, PROMPT)), "--gen-length", str(CANVAS), "--seed", "3"]
    command += ["--threads", "1", "--tensor-parallel", str(ranks), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow  # two ranks in process in CI, above
def test_dllm_generate_reports_each_diffusion_gemma_rank_holding_at_most_its_share():
    for ranks in (2, 4):
        held = _generate(ranks)["weights_bytes_per_rank"] // 8  # float64
        assert held <= share_of(ranks)[0], ranks


class _Reads:
    """The checkpoint's tensors as its reader lists them, each read recorded: the bytes of every box read."""

    def __init__(self, tensors) -> None:
        self.tensors, self.sizes = tensors, []

    def __call__(self, model_dir):
        for key, tensor in self.tensors(model_dir):
            yield key, _Recorded(tensor, self.sizes)


class _Recorded:
    def __init__(self, tensor, sizes: list[int]) -> None:
        self.tensor, self.sizes, self.shape = tensor, sizes, tensor.shape

    def read(self, box):
        out = self.tensor.read(box)
        self.sizes.append(out.nbytes)
        return out


@pytest.mark.parametrize("rank", [0, 1])
def test_a_diffusion_gemma_rank_reads_only_its_slices_of_a_checkpoint(monkeypatch, rank):
    """Each tensor's slice read from the file, a chunk at a time: what a rank reads is its share (and the
    layer scalars, read whole), never a whole tensor it splits, and it holds its share."""
    whole = load_model(str(CHECKPOINT))
    reads = _Reads(weights.checkpoint_tensors)
    monkeypatch.setattr(weights, "checkpoint_tensors", reads)
    loaded = load_shard(str(CHECKPOINT), TensorParallel(rank, 2))
    scalars = sum(t.nbytes for name, t in whole.model.named_buffers() if name.endswith("layer_scalars"))
    assert sum(reads.sizes) <= loaded.weights_bytes + scalars < whole.weights_bytes, sum(reads.sizes)
    assert max(reads.sizes) <= CHUNK_BYTES
    assert loaded.weights_bytes // 8 <= share_of(2, str(CHECKPOINT))[0] // 2  # float32: half of float64


def test_a_diffusion_gemma_checkpoint_the_preflight_refuses_whole_loads_as_a_rank(monkeypatch):
    """Its own loader is preflighted too (the weights judged before any is read); a rank, its share."""
    whole = load_model(str(CHECKPOINT), dtype="float64").weights_bytes
    monkeypatch.setattr("engine_pod.device_memory.total_memory", lambda device: whole * 3 // 4)
    with pytest.raises(ModelLoadError, match="more than the"):
        load_model(str(CHECKPOINT), dtype="float64")
    assert load_shard(str(CHECKPOINT), TensorParallel(1, 2), dtype="float64").weights_bytes <= whole * 3 // 4
