"""Block-causal rows over long prefixes, one SDPA call per block of queries (engine_pod/models/block_chunks.py):
the same bits, in float32 and float64, as each row attending over all its keys under one mask built here from
positions (not from the engine's rule), for whole prompts, chunks and a cycle's committed and active blocks,
at lengths that are no multiple of the kernel's key block, alone and batched; and LLaDA2.0's and SDAR's
tokens over prompts longer than a key block the same with and without the calls, chunked and whole."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.models import block_chunks, ragged
from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.attention_rules import Masking
from engine_pod.models.ragged import RaggedAttention, RowSpans, starts_of
from engine_pod.models.window_chunks import KEY_BLOCK
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import run_workload
from tests.factories import BLOCK_REFERENCE_DIR


def _whole_row(q, k, v, block: int) -> torch.Tensor:
    """One row [T, H, hd] (its last key positions) over its keys [K, Hkv, hd] as one SDPA call under a
    block-causal mask: K/V heads repeated, query at position p seeing the keys of p's block and earlier."""
    heads, first = q.shape[1], k.shape[0] - q.shape[0]
    query_block = torch.arange(first, k.shape[0])[:, None] // block
    mask = torch.arange(k.shape[0])[None, :] // block <= query_block
    keys, values = (t.transpose(0, 1).repeat_interleave(heads // t.shape[1], dim=0)[None] for t in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, values, attn_mask=mask[None, None])
    return out[0].transpose(0, 1)


# (block, each row's (cached keys, queries)): a whole prompt whose keys end inside a key block, chunks of 512
# and of 256 (ending on and inside a key block), a cycle's committed block beside its active one, a block of 4
# (the reference models'), and rows of one shape batched beside others
GEOMETRIES = [
    (32, [(0, 1312)]),
    (32, [(1024, 512), (1280, 256), (1184, 64)]),
    (32, [(992, 64), (992, 64), (0, 608)]),
    (4, [(0, 1028), (1020, 8)]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("block", "rows"), GEOMETRIES)
def test_rows_in_block_calls_are_the_whole_rows_under_one_mask(block, rows, dtype):
    q_len = [new for _, new in rows]
    k_len = [cached + new for cached, new in rows]
    spans = RowSpans(starts_of(q_len), q_len, starts_of(k_len), k_len)
    plan = RaggedAttention(spans, torch.device("cpu"), Masking(block=block))
    assert all(group.chunks for group in plan.groups)  # every row here takes the block calls
    generator = torch.Generator().manual_seed(block + len(rows))
    q = torch.randn(sum(q_len), 4, 16, dtype=dtype, generator=generator) * 2
    k = torch.randn(sum(k_len), 2, 16, dtype=dtype, generator=generator) * 2
    v = torch.randn(sum(k_len), 2, 16, dtype=dtype, generator=generator)
    out = ragged_attention(q, k, v, plan)
    for r in range(len(rows)):
        queries = slice(spans.q_start[r], spans.q_start[r] + spans.q_len[r])
        keys = slice(spans.k_start[r], spans.k_start[r] + spans.k_len[r])
        expected = _whole_row(q[queries], k[keys], v[keys], block)
        torch.testing.assert_close(out[queries], expected, rtol=0, atol=1e-5)
        # each call's keys end with the kernel's key block: the same bits as the whole row
        assert torch.equal(out[queries], expected)


def test_a_blocks_call_reads_its_keys_to_the_end_of_their_key_block_only():
    chunks = block_chunks.block_chunks(Masking(block=32), 608, 1600, torch.device("cpu"))
    assert [c.q_start for c in chunks] == list(range(0, 608, 32))
    assert all(c.q_end - c.q_start == 32 and c.k_start == 0 for c in chunks)
    for c in chunks:
        end = 992 + c.q_end  # the block's last key, plus one
        assert c.k_end == min(1600, -(-end // KEY_BLOCK) * KEY_BLOCK)
        if c.k_end == end:
            assert c.mask is None
        else:
            assert c.mask.shape == (1, c.k_end) and c.mask[0].tolist() == [j < end for j in range(c.k_end)]


def test_short_rows_and_other_maskings_attend_under_one_mask():
    cpu = torch.device("cpu")
    assert block_chunks.block_chunks(Masking(block=32), 32, 5000, cpu) == ()  # an active block alone
    assert block_chunks.block_chunks(Masking(block=32), 256, KEY_BLOCK, cpu) == ()  # one key block
    assert block_chunks.block_chunks(Masking(causal=True), 5000, 5000, cpu) == ()
    assert block_chunks.block_chunks(Masking(), 5000, 5000, cpu) == ()


@pytest.fixture(scope="module", params=["llada2", "sdar"])
def block_model(request):
    return load_model(str(BLOCK_REFERENCE_DIR / request.param), dtype="float64")


def test_tokens_over_long_prompts_are_those_of_one_mask(block_model, monkeypatch):
    """Prompts longer than a key block and a short one, greedy and seeded, alone, in one BlockServe batch
    computed whole and in chunks: the same tokens as every row under one mask."""
    block = 4
    workload = [(f"r{n}", [3 + (7 * i + n) % 400 for i in range(n)], 2 * block) for n in (1030, 700, 9)]
    sampling = {"r700": RequestParams(temperature=1.0, seed=11), "r9": RequestParams(temperature=1.0, seed=5)}
    decoding = DecodingConfig(block_length=block, steps_per_block=block, cache="dual", ignore_eos=True)
    calls = []
    made = block_chunks.block_chunks
    monkeypatch.setattr(ragged, "block_chunks", lambda *a: calls.append(1) or made(*a))

    def runs() -> list[dict[str, list[int]]]:
        outputs = [
            run_workload(
                block_model, partial(sequential_scheduler, block, []), decoding, workload, None, sampling
            )
        ]
        for chunk in (0, 128):
            config = SchedulerConfig(token_budget=4096, prefill_chunk=chunk)
            scheduler = partial(BlockServeScheduler, block, [], config)
            outputs.append(run_workload(block_model, scheduler, decoding, workload, [2, 1, 0], sampling))
        return outputs

    with_calls = runs()
    assert any(calls) and all(len(tokens) >= 2 * block for tokens in with_calls[0].values())
    monkeypatch.setattr(ragged, "block_chunks", lambda *a: ())
    under_one_mask = runs()
    assert with_calls == under_one_mask
    assert with_calls[0] == with_calls[1] == with_calls[2]
