"""Chunked prefill on the product path: ``dllm serve --prefill-chunk`` on a block-diffusion model answers
a long prompt beside short ones through the official client, and the worker's /metrics count its chunks
and their tokens."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from engine_pod.serve.redis_server import free_port
from tests.serving.serve_process import openai_client, running

CHUNK, BLOCK, LONG = 256, 32, 1500
TOKEN = 65


def _metric(text: str, name: str) -> float:
    (value,) = [float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == name]
    return value


def test_a_long_prompt_is_prefilled_in_chunks_beside_short_ones(tmp_path):
    port = free_port()
    flags = ("--model", "random:sdar-tiny", "--prefill-chunk", str(CHUNK), "--metrics-port", str(port))
    with running(tmp_path, *flags) as server:
        client = openai_client(server)

        def ask(prompt: list[int]) -> int:
            answer = client.completions.create(model="sdar-tiny", prompt=prompt, max_tokens=BLOCK)
            return answer.usage.prompt_tokens

        prompts = [[TOKEN] * LONG] + [[TOKEN + i] * 40 for i in range(1, 5)]
        with ThreadPoolExecutor(len(prompts)) as pool:
            assert list(pool.map(ask, prompts)) == [len(p) for p in prompts]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    # the prompt up to its first block (1472 tokens on the grid) less its last chunk, a chunk per cycle
    first_block = LONG // BLOCK * BLOCK
    chunks = (first_block - 1) // CHUNK
    assert _metric(metrics, "dllm_prefill_chunks_total") == chunks
    assert _metric(metrics, "dllm_prefill_chunk_tokens_total") == chunks * CHUNK
    assert _metric(metrics, "dllm_prefill_chunk_wait_seconds_total") >= 0
