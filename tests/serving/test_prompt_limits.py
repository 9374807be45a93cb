"""Prompt limits from the model, through ``dllm serve`` and the official client: a prompt and its
max_tokens may take the model's whole context (its config.json's), no more; past it, OpenAI's
``context_length_exceeded`` naming the numbers; a request the worker's token budget can never hold is
refused at once, never left waiting."""

from __future__ import annotations

import openai
import pytest

from tests.serving.serve_process import openai_client, running

SDAR_CONTEXT = 4096  # sdar-tiny's max_position_embeddings
TOKEN = 65  # a byte of the random models' byte-level tokenizer


def _refusal(call) -> dict:
    with pytest.raises(openai.BadRequestError) as refused:
        call()
    assert refused.value.status_code == 400
    return refused.value.body


def test_prompts_fill_the_models_context_and_one_past_it_is_refused(tmp_path):
    flags = ("--model", "random:sdar-tiny", "--token-budget", "8192")
    with running(tmp_path, *flags) as server:
        client = openai_client(server)
        card = client.models.retrieve("sdar-tiny")
        assert (card.context_length, card.max_prompt_tokens) == (SDAR_CONTEXT, SDAR_CONTEXT - 1)
        longest = SDAR_CONTEXT - 32
        answer = client.completions.create(model="sdar-tiny", prompt=[TOKEN] * longest, max_tokens=32)
        assert answer.usage.prompt_tokens == longest and answer.choices[0].finish_reason in ("stop", "length")
        error = _refusal(
            lambda: client.completions.create(
                model="sdar-tiny", prompt=[TOKEN] * (longest + 1), max_tokens=32
            )
        )
        assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
        assert (
            f"{SDAR_CONTEXT} tokens" in error["message"]
            and f"{longest + 1} prompt tokens" in error["message"]
        )
        assert "max_tokens 32" in error["message"]
        error = _refusal(  # counted from its bytes before it is tokenized: far past the context
            lambda: client.completions.create(model="sdar-tiny", prompt="A" * 40 * SDAR_CONTEXT)
        )
        assert error["code"] == "context_length_exceeded" and "at least" in error["message"]


def test_a_prompt_the_token_budget_cannot_hold_is_refused_at_once(tmp_path):
    """A budget below the model's context bounds the prompt: refused in one line, not queued forever."""
    budget, block = 2048, 32
    flags = ("--model", "random:sdar-tiny", "--token-budget", str(budget), "--block-length", str(block))
    with running(tmp_path, *flags) as server:
        client = openai_client(server)
        held = budget - block + 1
        assert client.models.retrieve("sdar-tiny").context_length == held
        error = _refusal(
            lambda: client.completions.create(model="sdar-tiny", prompt=[TOKEN] * 3000, max_tokens=32)
        )
        assert error["code"] == "context_length_exceeded" and f"{held} tokens" in error["message"]
        fits = client.completions.create(model="sdar-tiny", prompt=[TOKEN] * (held - 64), max_tokens=64)
        assert fits.usage.prompt_tokens == held - 64


@pytest.mark.slow
def test_a_30000_token_prompt_is_answered_on_a_32k_model(tmp_path):
    flags = ("--model", "random:llada2-tiny", "--token-budget", "40000")  # beyond the context: its own
    with running(tmp_path, *flags) as server:
        client = openai_client(server)
        client.timeout = 1800
        answer = client.completions.create(model="llada2-tiny", prompt=[TOKEN] * 30_000, max_tokens=32)
        assert answer.usage.prompt_tokens == 30_000
        error = _refusal(
            lambda: client.completions.create(model="llada2-tiny", prompt=[TOKEN] * 32_768, max_tokens=32)
        )
        assert error["code"] == "context_length_exceeded" and "32768 tokens" in error["message"]
