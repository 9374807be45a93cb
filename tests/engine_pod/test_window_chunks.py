"""Sliding-window attention over long rows in chunks of queries (engine_pod/models/window_chunks.py): the
same bits, in float64, as each row attending over all its keys under one mask built here from positions
(not from the engine's rule), for rows several times the window, with and without kept context, at
lengths that are no multiple of the kernel's key block; and DiffusionGemma's tokens over long prompts the
same chunked and unchunked, alone and batched."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from dllm_contracts.request_params import RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.kinds.canvas.context_cache import sdpa_style
from engine_pod.loading.loader import load_model
from engine_pod.models import window_chunks
from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.attention_rules import Masking
from engine_pod.models.ragged import RaggedAttention, RowSpans, starts_of
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.static import sequential_scheduler
from tests.engine_utils import run_workload


def _whole_row(q, k, v, first: int, window: int) -> torch.Tensor:
    """One row [T, H, hd] over its keys [K, Hkv, hd] as the reference calls SDPA under a mask: the K/V heads
    repeated, head-major, scale 1, query i at key position first + i seeing keys (p - window, p]."""
    heads = q.shape[1]
    query_at = torch.arange(first, first + q.shape[0])[:, None]
    key_at = torch.arange(k.shape[0])[None, :]
    mask = (key_at <= query_at) & (key_at > query_at - window)
    queries = q.transpose(0, 1)[None].contiguous()
    keys, values = (t.transpose(0, 1).repeat_interleave(heads // t.shape[1], dim=0)[None] for t in (k, v))
    out = F.scaled_dot_product_attention(
        queries, keys.contiguous(), values.contiguous(), attn_mask=mask[None, None], scale=1.0
    )
    return out[0].transpose(0, 1)


# (window, each row's kept context and new tokens), every row over more keys than CHUNKED_ABOVE: windows of 2
# and 514 make a chunk's first key the last of a key block (an off-by-one in its first key drops it)
GEOMETRIES = [
    (128, [(0, 3000), (127, 3000), (127, 3000)]),
    (128, [(127, 2900), (0, 2100)]),
    (2, [(0, 2400), (1, 2400)]),
    (514, [(0, 2600), (256, 2600)]),
]


@pytest.mark.parametrize(("window", "rows"), GEOMETRIES)
def test_chunked_rows_are_the_whole_rows_under_one_mask(window, rows):
    q_len = [new for _, new in rows]
    k_len = [kept + new for kept, new in rows]
    spans = RowSpans(starts_of(q_len), q_len, starts_of(k_len), k_len)
    masking = Masking(causal=True, window=window)
    plan = RaggedAttention(spans, torch.device("cpu"), masking, sdpa_style(16))
    assert all(group.chunks for group in plan.groups)  # every row here takes the chunked path
    generator = torch.Generator().manual_seed(window)
    q = torch.randn(sum(q_len), 4, 16, dtype=torch.float64, generator=generator) * 2
    k = torch.randn(sum(k_len), 2, 16, dtype=torch.float64, generator=generator) * 2
    v = torch.randn(sum(k_len), 2, 16, dtype=torch.float64, generator=generator)
    out = ragged_attention(q, k, v, plan)
    for r, (kept, _) in enumerate(rows):
        queries = slice(spans.q_start[r], spans.q_start[r] + spans.q_len[r])
        keys = slice(spans.k_start[r], spans.k_start[r] + spans.k_len[r])
        expected = _whole_row(q[queries], k[keys], v[keys], kept, window)
        torch.testing.assert_close(out[queries], expected, rtol=0, atol=1e-12)
        # the chunks' keys are whole blocks of the CPU flash kernel's: the same bits as the whole row
        assert torch.equal(out[queries], expected)


def test_a_chunk_reads_a_bounded_number_of_keys_whatever_the_rows_length():
    for keys in (2100, 2900, 7500):
        chunks = window_chunks.window_chunks(
            Masking(causal=True, window=128), keys, keys, torch.device("cpu")
        )
        assert [(a.q_end, b.q_start) for a, b in zip(chunks, chunks[1:])] == [
            (c.q_end, c.q_end) for c in chunks[:-1]
        ]
        assert chunks[0].q_start == 0 and chunks[-1].q_end == keys
        assert all(c.q_end - c.q_start >= 768 for c in chunks)  # the kernel blocks them by 256, as the row
        assert max(c.k_end - c.k_start for c in chunks) <= 2048
        assert len({id(c.mask) for c in chunks}) <= 4  # chunks of one shape share their mask


def test_short_rows_and_other_maskings_attend_under_one_mask():
    cpu = torch.device("cpu")
    short = window_chunks.CHUNKED_ABOVE
    assert window_chunks.window_chunks(Masking(causal=True, window=128), short, short, cpu) == ()
    assert window_chunks.window_chunks(Masking(causal=True), 5000, 5000, cpu) == ()
    assert window_chunks.window_chunks(Masking(block=32), 5000, 5000, cpu) == ()


@pytest.fixture(scope="module")
def gemma64():
    return load_model("random:diffusion-gemma-tiny", dtype="float64")


def test_diffusion_gemma_tokens_over_long_prompts_are_the_same_chunked(gemma64, monkeypatch):
    """Prompts longer than the window and the chunking threshold (and no multiple of the key block) and a
    short one, greedy and seeded, alone and in one BlockServe batch: the same tokens as unchunked."""
    canvas = gemma64.config.canvas_length
    workload = [(f"r{n}", [3 + (7 * i + n) % 1000 for i in range(n)], 2 * canvas) for n in (2100, 2700, 20)]
    sampling = {"r2700": RequestParams(seed=11), "r20": RequestParams(seed=5)}  # r2100 greedy
    decoding = DecodingConfig(block_length=canvas, steps_per_block=8)
    calls = []
    chunked = window_chunks.sdpa_by_chunks
    monkeypatch.setattr("engine_pod.models.ragged.sdpa_by_chunks", lambda *a: calls.append(1) or chunked(*a))
    scheduling = SchedulerConfig(token_budget=4096)

    def runs() -> list[dict[str, list[int]]]:
        alone = run_workload(
            gemma64, partial(sequential_scheduler, canvas, []), decoding, workload, None, sampling
        )
        batch = run_workload(
            gemma64,
            partial(BlockServeScheduler, canvas, [], scheduling),
            decoding,
            workload,
            [2, 1, 0],
            sampling,
        )
        return [alone, batch]

    with_chunks = runs()
    assert calls  # the long prompts took the chunked path
    monkeypatch.setattr(window_chunks, "CHUNKED_ABOVE", 10**9)
    calls.clear()
    without = runs()
    assert not calls
    assert with_chunks[0] == with_chunks[1] == without[0] == without[1]
    assert all(len(tokens) == 2 * canvas for tokens in with_chunks[0].values())
