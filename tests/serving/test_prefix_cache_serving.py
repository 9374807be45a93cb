"""The block prefix cache through ``dllm serve``: a conversation's second turn, which resends the first,
finds its blocks cached (the worker's /metrics says so) and is answered as with the cache off; a warmed
system prompt (``--warm-prefix system:...``) is hit by the first chat that sends it."""

from __future__ import annotations

import re

import httpx
import pytest

from engine_pod.serve.redis_server import free_port
from tests.serving.serve_process import openai_client, running
from tests.serving_utils import WAIT_S, wait_for, write_served_model

SYSTEM = "you answer in short lines . " * 12  # several whole blocks before the first user message


def _hit_tokens(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    match = re.search(r"^dllm_prefix_cache_hit_tokens_total (\S+)$", text, re.MULTILINE)
    assert match is not None, "dllm_prefix_cache_hit_tokens_total is not in /metrics"
    return float(match.group(1))


def _conversation(tmp_path, model, cache: str) -> tuple[list[str], float, float]:
    """Two turns (the second resends the first and its answer): the answers, and the hit tokens the
    worker's /metrics showed after the first turn and after the second."""
    port = free_port()
    (tmp_path / cache).mkdir()
    argv = ("--model", str(model), "--metrics-port", str(port), "--prefix-cache", cache)
    with running(tmp_path / cache, *argv) as server:
        client = openai_client(server)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "count to 5 ."}]
        answers, hits = [], []
        for follow_up in ("now count to 9 .", None):
            reply = client.chat.completions.create(model=model.name, messages=messages, max_tokens=32)
            answers.append(reply.choices[0].message.content)
            if cache == "on" and follow_up is None:  # the worker counts them after the cycle it sends from
                wait_for(lambda: _hit_tokens(port) > hits[0], WAIT_S, 0.1)
            hits.append(_hit_tokens(port) if cache == "on" else 0.0)
            messages += [{"role": "assistant", "content": answers[-1]}]
            if follow_up:
                messages += [{"role": "user", "content": follow_up}]
    return answers, hits[0], hits[1]


def test_a_second_turn_hits_the_first_turns_blocks_and_answers_as_without_the_cache(tmp_path):
    model = write_served_model(tmp_path / "tiny-llada2", family="llada2")
    with_cache, first_hits, second_hits = _conversation(tmp_path, model, "on")
    without_cache, _, _ = _conversation(tmp_path, model, "off")
    assert first_hits == 0 < second_hits
    assert with_cache == without_cache


def _pinned_tokens(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    match = re.search(r"^dllm_prefix_cache_pinned_tokens (\S+)$", text, re.MULTILINE)
    assert match is not None, "dllm_prefix_cache_pinned_tokens is not in /metrics"
    return float(match.group(1))


@pytest.mark.slow  # a dllm serve of its own (~10 s); tests/serving/test_warm_prefix.py covers the worker in CI
def test_a_warmed_system_prompt_is_hit_by_the_first_chat_that_sends_it(tmp_path):
    """``dllm serve --warm-prefix system:...``: the first chat, with nothing before it, finds the system
    prompt's blocks cached (the worker's /metrics), warmed before the API answered."""
    model = write_served_model(tmp_path / "tiny-llada2", family="llada2")
    port = free_port()
    argv = ("--model", str(model), "--metrics-port", str(port), "--warm-prefix", f"system:{SYSTEM}")
    with running(tmp_path, *argv) as server:
        pinned = _pinned_tokens(port)
        assert pinned > 0 and _hit_tokens(port) == 0
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "count to 5 ."}]
        openai_client(server).chat.completions.create(model=model.name, messages=messages, max_tokens=8)
        wait_for(lambda: _hit_tokens(port) == pinned, WAIT_S, 0.1)
