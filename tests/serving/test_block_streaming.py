"""Block-diffusion models through ``dllm serve`` and the official client: the shipped block models (and a
random preset, with the shipped tokenizer) answer the README's request, and a stream sends one content
chunk per committed block, for prompts on and off the block grid, whose text is the whole answer's; an
answer shorter than the steps per block is the one ``dllm generate`` decodes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.serving.serve_process import openai_client, running

BLOCK = 8  # a small block: several blocks per answer, prompts of every length modulo it
MAX_TOKENS = 20
SHORT = 3  # fewer tokens than the steps per block: LLaDA2.0's reference caps its steps at them
README_MESSAGE = [{"role": "user", "content": "letters from t to z ."}]
WORDS = ["count", "from", "one", "to", "nine", "and", "then", "letters", "a", "b", "c"]


@pytest.mark.parametrize("model", ["tiny-llada2-random", "tiny-sdar-random"])
def test_a_block_model_streams_one_chunk_per_committed_block_on_and_off_the_grid(tmp_path, model):
    flags = ("--model", f"builtin:{model}", "--block-length", str(BLOCK), "--steps-per-block", str(BLOCK))
    heads = set()
    with running(tmp_path, *flags) as server:
        client = openai_client(server)
        readme = client.chat.completions.create(model=model, messages=README_MESSAGE)
        assert readme.choices[0].finish_reason in ("stop", "length") and readme.usage.completion_tokens > 0
        for words in (5, 2, 8):  # with the chat template's tokens: prompts of 0, 5 and 3 modulo the block
            messages = [{"role": "user", "content": " ".join(WORDS[:words])}]
            whole = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS)
            stream = client.chat.completions.create(
                model=model, messages=messages, max_tokens=MAX_TOKENS, stream=True
            )
            contents = [
                c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content
            ]
            head = whole.usage.prompt_tokens % BLOCK  # the prompt's tail shares the first block
            blocks = math.ceil((head + whole.usage.completion_tokens) / BLOCK)
            assert "".join(contents) == whole.choices[0].message.content
            assert len(contents) == blocks, (words, head, contents)
            heads.add(head)
        short = client.completions.create(model=model, prompt=README_MESSAGE[0]["content"], max_tokens=SHORT)
    assert 0 in heads and len(heads) > 1  # on the grid and off it
    expected = _generate(model, README_MESSAGE[0]["content"], SHORT)
    assert short.choices[0].text == expected["text"]
    assert short.usage.completion_tokens == expected["completion_tokens"]


def _generate(model: str, prompt: str, gen_length: int) -> dict:
    """``dllm generate`` with the serving defaults (block canvas) and the served block length and steps."""
    argv = [sys.executable, "-m", "engine_pod.cli.main", "generate", "--model", f"builtin:{model}"]
    argv += ["--prompt", prompt, "--gen-length", str(gen_length), "--canvas", "block", "--json"]
    argv += ["--block-length", str(BLOCK), "--steps-per-block", str(BLOCK)]
    return json.loads(subprocess.run(argv, check=True, capture_output=True, text=True, timeout=600).stdout)


def test_a_random_preset_is_served_with_the_shipped_tokenizer(tmp_path):
    with running(tmp_path, "--model", "random:llada2-tiny", "--block-length", str(BLOCK)) as server:
        reply = openai_client(server).chat.completions.create(
            model="llada2-tiny", messages=README_MESSAGE, max_tokens=MAX_TOKENS
        )  # random weights never stop early: a short answer is the whole point here
    assert reply.usage.completion_tokens > 0 and reply.choices[0].finish_reason in ("stop", "length")
