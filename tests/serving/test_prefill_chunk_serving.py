"""Chunked prefill on the product path: ``dllm serve --prefill-chunk`` on a block-diffusion model, and on
DiffusionGemma (its context encoder a chunk per cycle) with a prompt near its 8k context, answers a long
prompt beside short ones through the official client, and the worker's /metrics count its chunks and their
tokens."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine_pod.serve.redis_server import free_port
from tests.serving.serve_process import openai_client, running

BLOCK = 32  # both models' block (DiffusionGemma's canvas)
TOKEN = 65


def _metric(text: str, name: str) -> float:
    (value,) = [float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == name]
    return value


@pytest.mark.parametrize(
    ("model", "long", "chunk", "grid"),
    [("sdar-tiny", 1500, 256, True), ("diffusion-gemma-tiny", 7500, 512, False)],
)
def test_a_long_prompt_is_prefilled_in_chunks_beside_short_ones(tmp_path, model, long, chunk, grid):
    port = free_port()
    flags = ("--model", f"random:{model}", "--prefill-chunk", str(chunk), "--metrics-port", str(port))
    with running(tmp_path, *flags, "--token-budget", "16384") as server:
        client = openai_client(server)

        def ask(prompt: list[int]) -> int:
            answer = client.completions.create(model=model, prompt=prompt, max_tokens=BLOCK)
            return answer.usage.prompt_tokens

        prompts = [[TOKEN] * long] + [[TOKEN + i] * 40 for i in range(1, 5)]
        with ThreadPoolExecutor(len(prompts)) as pool:
            assert list(pool.map(ask, prompts)) == [len(p) for p in prompts]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    # the prompt up to its first block (on the grid: 1472 tokens; DiffusionGemma's canvas follows the whole
    # prompt) less its last chunk, a chunk per cycle
    first_block = long // BLOCK * BLOCK if grid else long
    chunks = (first_block - 1) // chunk
    assert _metric(metrics, "dllm_prefill_chunks_total") == chunks
    assert _metric(metrics, "dllm_prefill_chunk_tokens_total") == chunks * chunk
    assert _metric(metrics, "dllm_prefill_chunk_wait_seconds_total") >= 0
