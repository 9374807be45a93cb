"""What the gateway makes of a worker's blocks and results, exactly: chunk boundaries, max_tokens and stop
cuts, EOS, echo, n, usage, log probabilities whole and streamed, error results, a gap in the blocks.

The real gateway (uvicorn, real Redis) faces a scripted peer that speaks the real queue protocol
(candidates, claim, commit, complete: the worker's own calls and its own max_tokens rule) and answers
each request with tokens and log probabilities the test chooses. A model's answers cannot be chosen, so
these expectations could not be exact against a worker; the product path (`dllm serve`, the official
client) is tests/serving/test_openai_conformance.py. These are also the fast tests the gateway's mutation
run uses (docs/mutation-testing.md)."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dllm_contracts.queue.connect import sync_client
from dllm_contracts.queue.messages import BlockEvent, DoneEvent, QueuedRequest
from dllm_contracts.queue.ops import BlockCommit, QueueOps
from dllm_contracts.queue.resilience import REDIS_ERRORS
from dllm_contracts.queue.sync_client import SyncQueue
from dllm_contracts.request_params import RequestParams
from dllm_contracts.text import completion_tokens, within_limit
from engine_pod.serve.redis_server import RedisServer
from gateway.tokenizer import GatewayTokenizer
from tests.serving_utils import BLOCK, GatewayServer, gateway_settings, wait_for

ANSWER = "the cat . a b c d e f the blue dog . copy from a to f ."  # words the test tokenizer knows


@dataclass
class Script:
    """How the peer answers: the tokens (whole blocks are committed), or an error; ``skip_block``: a
    block whose event is not published (as when Redis lost it)."""

    text: str = ANSWER
    tokens: list[int] | None = None  # instead of the text's tokens (a byte sequence that is not UTF-8)
    eos_after: int | None = None  # tokens before an EOS
    error: str | None = None
    skip_block: int | None = None
    wait_for_cancel_after: int | None = None  # a block after which the peer waits for a cancellation
    lose_logprobs: bool = False  # a result without its log probabilities (their record was lost)
    hold: bool = False  # claim and never answer (a worker that hangs)


def entry_of(position: int, token: int) -> list:
    """The log probability entry the peer records for a token: distinct per position."""
    return [-0.01 * (position + 1), [[token, -0.01 * (position + 1)], [5, -3.0 - position]]]


class ScriptedPeer(threading.Thread):
    def __init__(self, url: str, service: str, tokenizer: GatewayTokenizer, script: Script) -> None:
        super().__init__(daemon=True)
        self.queue = SyncQueue(sync_client(url), QueueOps(service))
        self.tokenizer, self.script = tokenizer, script
        self.cancelled: set[str] = set()
        self.seen: list[QueuedRequest] = []  # every request claimed, as the gateway queued it
        self.held: list[str] = []  # ids claimed and never answered (Script.hold)
        self.halt = threading.Event()
        self.busy = False  # answering what it claimed

    def idle(self) -> bool:
        """Nothing being answered and nothing waiting to be claimed (a test's leftovers are done)."""
        return not self.busy and not self.queue.candidates(10_000, 1).shortest

    def tokens_for(self, request: QueuedRequest) -> list[int]:
        tokens = self.script.tokens or self.tokenizer.encode(self.script.text)
        if self.script.eos_after is not None:
            tokens = tokens[: self.script.eos_after] + [min(self.tokenizer.eos_ids)] + tokens
        blocks = -(-request.max_tokens // BLOCK)
        return (tokens * blocks)[: blocks * BLOCK]

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                read = self.queue.candidates(10_000, 16)
                claimed = self.queue.claim_chosen("peer", [(c.id, c.prefix) for c in read.shortest])
            except REDIS_ERRORS:  # a test stopped Redis: wait for it as a worker does
                claimed = []
            self.busy = bool(claimed)
            for item in claimed:
                self.answer(item.request)
            self.busy = False
            if not claimed:
                time.sleep(0.01)

    def cancellation_of(self, request_id: str, patience_s: float = 30) -> bool:
        give_up = time.monotonic() + patience_s
        while request_id not in self.queue.commit("peer", [], [], [request_id]).cancelled:
            if time.monotonic() >= give_up:
                return False
            time.sleep(0.01)
        return True

    def answer(self, request: QueuedRequest) -> None:
        self.seen.append(request)
        prompt = len(request.prompt_ids)
        if self.script.hold:
            self.held.append(request.id)
            return
        if self.script.error:
            done = DoneEvent([], "error", prompt, 0, "peer", self.script.error, request.meta)
            self.queue.complete("peer", request.id, done)
            return
        tokens = self.tokens_for(request)
        entries = (
            [entry_of(i, t) for i, t in enumerate(tokens)] if request.params.logprobs is not None else None
        )
        for index in range(len(tokens) // BLOCK):
            end = (index + 1) * BLOCK
            block = tokens[end - BLOCK : end]
            block_entries = entries[end - BLOCK : end] if entries else None
            shown = max(0, request.max_tokens - (end - BLOCK))  # as a worker does: events cut to max_tokens
            event = None
            if request.stream and shown:
                shown_entries = block_entries[:shown] if block_entries else None
                event = BlockEvent(index, block[:shown], shown_entries, offset=end - BLOCK)
            if index == self.script.skip_block:
                event = None
            commit = BlockCommit(request.id, event, tokens[:end], prompt + end, index, block_entries)
            cancelled = request.id in self.queue.commit("peer", [commit], [], [request.id]).cancelled
            if index == self.script.wait_for_cancel_after:  # streamed or not
                cancelled = self.cancellation_of(request.id)
            if cancelled:
                self.cancelled.add(request.id)
                return
        kept, reason = within_limit(tokens, request.max_tokens, self.tokenizer.eos_ids)
        recorded = entries[: len(kept)] if entries and not self.script.lose_logprobs else None
        done = DoneEvent(
            kept,
            reason,
            prompt,
            completion_tokens(kept, self.tokenizer.eos_ids),
            "peer",
            None,
            request.meta,
            logprobs=recorded,
        )
        self.queue.complete("peer", request.id, done)


@contextlib.contextmanager
def _stack(served_model, redis_url: str, service: str, **overrides):
    tokenizer = GatewayTokenizer(str(served_model))
    peer = ScriptedPeer(redis_url, service, tokenizer, Script())
    with GatewayServer(gateway_settings(served_model, redis_url, service, **overrides)) as server:
        peer.start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                yield client, peer, tokenizer
        finally:
            peer.halt.set()
            peer.join(timeout=10)


@pytest.fixture(scope="module")
def shared_stack(served_model):
    """One gateway, Redis and peer for every test with the default settings (a stack per test would
    add a second to each)."""
    server = RedisServer().start()
    try:
        with _stack(served_model, server.url, "answers") as stack:
            yield stack
    finally:
        server.stop()


@pytest.fixture
def gateway(request):
    """(client, peer, tokenizer): the peer answers as its ``script`` says (tests change it first).
    ``@pytest.mark.gateway_settings(...)`` overrides gateway settings (a stack of its own)."""
    marker = request.node.get_closest_marker("gateway_settings")
    if marker is None:
        client, peer, tokenizer = request.getfixturevalue("shared_stack")
        # the test before may have left a request the peer still answers (and sees cancelled) on a slow host
        wait_for(peer.idle, what="the peer to finish the test before's requests")
        peer.script, peer.seen, peer.cancelled = Script(), [], set()
        yield client, peer, tokenizer
        return
    served_model, redis_server = (
        request.getfixturevalue("served_model"),
        request.getfixturevalue("redis_server"),
    )
    with _stack(served_model, redis_server.url, request.getfixturevalue("service"), **marker.kwargs) as stack:
        yield stack


def _events(client: httpx.Client, path: str, body: dict) -> list:
    with client.stream("POST", path, json=body | {"stream": True}) as reply:
        assert reply.status_code == 200
        lines = [line[len("data: ") :] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _completion_body(**fields) -> dict:
    return {"model": "tiny", "prompt": "copy : cat dog ."} | fields


def _completion(client: httpx.Client, **fields) -> httpx.Response:
    return client.post("/v1/completions", json=_completion_body(**fields))


def _error(message: str, kind: str, code: str | None = None) -> dict:
    """OpenAI's error object for an error that names no field."""
    return {"message": message, "type": kind, "param": None, "code": code}


def _joined_logprobs(chunks: list) -> dict:
    """A completions stream's log probability objects joined key by key (the whole answer's object)."""
    objects = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    return {key: [v for o in objects for v in o[key]] for key in objects[0]}


def _chat_body(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]} | fields


def test_a_completion_is_the_answer_cut_at_max_tokens(gateway):
    client, peer, tokenizer = gateway
    reply = _completion(client, max_tokens=BLOCK + 3)
    assert reply.status_code == 200, reply.text
    expected = peer.tokens_for(QueuedRequest("x", [1], RequestParams(max_tokens=BLOCK + 3), 0))[: BLOCK + 3]
    (choice,) = reply.json()["choices"]
    assert (choice["text"], choice["finish_reason"]) == (tokenizer.decode(expected), "length")
    usage = reply.json()["usage"]
    assert usage == {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": BLOCK + 3,
        "total_tokens": usage["prompt_tokens"] + BLOCK + 3,
    }


def test_a_stream_sends_one_chunk_per_block_and_a_last_one_with_the_reason(gateway):
    client, peer, tokenizer = gateway
    max_tokens = 3 * BLOCK
    chunks = _events(
        client, "/v1/completions", {"model": "tiny", "prompt": "copy : cat dog .", "max_tokens": max_tokens}
    )
    tokens = peer.tokens_for(QueuedRequest("x", [1], RequestParams(max_tokens=max_tokens), 0))
    texts = [tokenizer.decode(tokens[: (i + 1) * BLOCK]) for i in range(3)]
    expected = [texts[0], texts[1][len(texts[0]) :], texts[2][len(texts[1]) :]]
    assert [c["choices"][0]["text"] for c in chunks] == [*expected, ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in chunks}) == 1
    assert {(c["model"], type(c["created"])) for c in chunks} == {("tiny", int)}
    assert [(c["choices"][0]["index"], c["choices"][0]["logprobs"]) for c in chunks] == [(0, None)] * 4
    with client.stream(
        "POST", "/v1/completions", json={"model": "tiny", "prompt": "hi", "stream": True}
    ) as r:
        assert r.headers["cache-control"] == "no-cache" and r.headers["content-type"].startswith("text/event")


def test_a_stop_string_cuts_the_answer_and_the_stream_cancels_the_rest(gateway):
    client, peer, tokenizer = gateway
    whole = _completion(client, max_tokens=4 * BLOCK, stop=["dog"]).json()["choices"][0]
    peer.script = Script(wait_for_cancel_after=1)  # the block with the stop string
    answer = tokenizer.decode(
        peer.tokens_for(QueuedRequest("x", [1], RequestParams(max_tokens=4 * BLOCK), 0))
    )
    assert BLOCK < len(tokenizer.encode(answer[: answer.index("dog")])) < 2 * BLOCK  # in the second block
    assert (whole["text"], whole["finish_reason"]) == (answer[: answer.index("dog")], "stop")
    chunks = _events(
        client,
        "/v1/completions",
        {"model": "tiny", "prompt": "copy : cat dog .", "max_tokens": 4 * BLOCK, "stop": ["dog"]},
    )
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert {c["choices"][0]["index"] for c in chunks} == {0}
    assert len(chunks) == 3  # the first block, the block with the stop string, the reason
    wait_for(lambda: peer.cancelled, what="the peer to see the cancellation")
    assert len(peer.cancelled) == 1  # the blocks after the stop string were not made


def test_an_eos_ends_the_text_and_counts_as_a_completion_token(gateway):
    client, peer, tokenizer = gateway
    peer.script = Script(eos_after=5)
    reply = _completion(client, max_tokens=2 * BLOCK).json()
    (choice,) = reply["choices"]
    assert choice["text"] == tokenizer.decode(tokenizer.encode(ANSWER)[:5])
    assert choice["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] == 6


def test_echo_puts_the_prompt_before_the_answer_streamed_and_not(gateway):
    client, _, tokenizer = gateway
    prompt = "copy : cat dog ."
    whole = _completion(client, max_tokens=BLOCK, echo=True).json()["choices"][0]["text"]
    echoed = tokenizer.decode(tokenizer.encode(prompt))
    assert whole.startswith(echoed) and len(whole) > len(echoed)
    chunks = _events(
        client, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": BLOCK, "echo": True}
    )
    assert chunks[0]["choices"][0]["text"] == echoed
    assert {c["choices"][0]["index"] for c in chunks} == {0}
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole


def test_completion_logprobs_are_the_recorded_ones_with_offsets_and_alternatives(gateway):
    client, peer, tokenizer = gateway
    max_tokens = 2 * BLOCK + 2  # three blocks: three streamed objects, each with its own offsets
    reply = _completion(client, max_tokens=max_tokens, logprobs=1).json()["choices"][0]
    tokens = peer.tokens_for(QueuedRequest("x", [1], RequestParams(max_tokens=max_tokens), 0))[:max_tokens]
    described = reply["logprobs"]
    assert described["token_logprobs"] == [entry_of(i, t)[0] for i, t in enumerate(tokens)]
    assert "".join(described["tokens"]) == reply["text"]
    offsets = [sum(len(p) for p in described["tokens"][:i]) for i in range(len(tokens))]
    assert described["text_offset"] == offsets
    decode = tokenizer.tokenizer.decode
    pieces = [  # the alternative (token 5) as it would read in each place: after the tokens before it
        decode(tokens[:i] + [5], skip_special_tokens=False)[
            len(decode(tokens[:i], skip_special_tokens=False)) :
        ]
        for i in range(len(tokens))
    ]
    assert [top[piece] for top, piece in zip(described["top_logprobs"], pieces)] == [
        -3.0 - i for i in range(len(tokens))
    ]
    assert pieces[1] != decode([5], skip_special_tokens=False)  # this decoder puts a space between tokens
    streamed = _events(
        client,
        "/v1/completions",
        {"model": "tiny", "prompt": "copy : cat dog .", "max_tokens": max_tokens, "logprobs": 1},
    )
    objects = [c["choices"][0]["logprobs"] for c in streamed if c["choices"][0]["logprobs"]]
    assert len(objects) == 3  # one per block
    joined = {key: [v for o in objects for v in o[key]] for key in described}
    assert joined == described


def test_echoed_prompt_tokens_have_null_logprobs_and_the_answers_follow(gateway):
    client, _, tokenizer = gateway
    reply = _completion(client, max_tokens=2 * BLOCK, logprobs=0, echo=True).json()["choices"][0]
    prompt_len = len(tokenizer.encode("copy : cat dog ."))
    values = reply["logprobs"]["token_logprobs"]
    assert values[:prompt_len] == [None] * prompt_len
    assert values[prompt_len:] == [-0.01 * (i + 1) for i in range(2 * BLOCK)]
    assert "".join(reply["logprobs"]["tokens"]) == reply["text"]
    streamed = _events(
        client,
        "/v1/completions",
        {"model": "tiny", "prompt": "copy : cat dog .", "max_tokens": 2 * BLOCK, "logprobs": 0, "echo": True},
    )
    objects = [c["choices"][0]["logprobs"] for c in streamed if c["choices"][0]["logprobs"]]
    assert [v for o in objects for v in o["token_logprobs"]] == values
    assert [v for o in objects for v in o["text_offset"]] == reply["logprobs"]["text_offset"]


def test_chat_logprobs_give_each_tokens_bytes_and_alternatives_whole_and_streamed(gateway):
    client, peer, tokenizer = gateway
    body = _chat_body(max_tokens=BLOCK, logprobs=True, top_logprobs=2)
    reply = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    content = reply["logprobs"]["content"]
    assert reply["logprobs"]["refusal"] is None
    tokens = peer.tokens_for(QueuedRequest("x", [1], RequestParams(max_tokens=BLOCK), 0))
    assert [c["logprob"] for c in content] == [entry_of(i, t)[0] for i, t in enumerate(tokens)]
    assert [c["bytes"] for c in content] == [list(c["token"].encode()) for c in content]
    assert "".join(c["token"] for c in content) == reply["message"]["content"]
    assert [[a["logprob"] for a in c["top_logprobs"]] for c in content] == [
        [v for _, v in entry_of(i, t)[1]] for i, t in enumerate(tokens)
    ]
    streamed = _events(client, "/v1/chat/completions", body)
    objects = [c["choices"][0]["logprobs"] for c in streamed if c["choices"][0]["logprobs"]]
    assert [c for o in objects for c in o["content"]] == content
    assert {c["choices"][0]["index"] for c in streamed} == {0}
    assert streamed[0]["choices"][0]["delta"] == {"role": "assistant", "content": reply["message"]["content"]}
    assert streamed[-1]["choices"][0]["delta"] == {} and streamed[-1]["object"] == "chat.completion.chunk"


def test_n_streams_each_choice_with_its_index_and_one_usage_for_all(gateway):
    client, _, tokenizer = gateway
    body = {
        "model": "tiny",
        "prompt": "copy : cat dog .",
        "max_tokens": BLOCK,
        "n": 2,
        "stream_options": {"include_usage": True},
    }
    chunks = _events(client, "/v1/completions", body)
    *choices, usage = chunks
    assert usage["choices"] == []
    prompt = len(tokenizer.encode("copy : cat dog ."))
    assert usage["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 2 * BLOCK,
        "total_tokens": prompt + 2 * BLOCK,
    }
    by_index = {}
    for chunk in choices:
        (choice,) = chunk["choices"]
        by_index.setdefault(choice["index"], []).append(choice["text"])
    assert sorted(by_index) == [0, 1]
    assert "".join(by_index[0]) == "".join(by_index[1]) != ""


def test_several_prompts_stream_as_choices_in_prompt_order(gateway):
    client, _, _ = gateway
    chunks = _events(
        client, "/v1/completions", {"model": "tiny", "prompt": ["copy : cat .", "hi"], "max_tokens": BLOCK}
    )
    reasons = {
        c["choices"][0]["index"]: c["choices"][0]["finish_reason"]
        for c in chunks
        if c["choices"][0]["finish_reason"]
    }
    assert reasons == {0: "length", 1: "length"}


def test_a_worker_error_is_a_400_and_in_a_stream_an_error_event_then_done(gateway):
    client, peer, _ = gateway
    peer.script = Script(error="the prompt is longer than this worker's token budget")
    reply = _completion(client)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == peer.script.error
    chunks = _events(client, "/v1/completions", {"model": "tiny", "prompt": "copy : cat dog ."})
    assert chunks == [{"error": reply.json()["error"]}]


def test_after_a_block_lost_to_a_fault_the_result_sends_the_rest(gateway):
    client, peer, tokenizer = gateway
    peer.script = Script(skip_block=1)
    max_tokens = 3 * BLOCK
    chunks = _events(
        client, "/v1/completions", {"model": "tiny", "prompt": "copy : cat dog .", "max_tokens": max_tokens}
    )
    tokens = peer.tokens_for(QueuedRequest("x", [1], RequestParams(max_tokens=max_tokens), 0))
    first = tokenizer.decode(tokens[:BLOCK])
    texts = [c["choices"][0]["text"] for c in chunks]
    assert texts == [first, tokenizer.decode(tokens)[len(first) :], ""]  # block 2 waits for the result


def test_logprobs_stop_at_an_eos(gateway):
    client, peer, _ = gateway
    peer.script = Script(eos_after=5)
    reply = _completion(client, max_tokens=2 * BLOCK, logprobs=0).json()["choices"][0]
    assert reply["logprobs"]["token_logprobs"] == [-0.01 * (i + 1) for i in range(5)]
    chat = client.post("/v1/chat/completions", json=_chat_body(max_tokens=2 * BLOCK, logprobs=True)).json()
    assert len(chat["choices"][0]["logprobs"]["content"]) == 5


def test_a_result_whose_logprobs_were_lost_has_nulls_in_their_place(gateway):
    client, peer, _ = gateway
    peer.script = Script(lose_logprobs=True)
    reply = _completion(client, max_tokens=BLOCK, logprobs=1).json()["choices"][0]["logprobs"]
    assert reply["token_logprobs"] == [None] * BLOCK and reply["top_logprobs"] == [None] * BLOCK
    chat = client.post("/v1/chat/completions", json=_chat_body(max_tokens=BLOCK, logprobs=True)).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert [(c["logprob"], c["top_logprobs"]) for c in content] == [(None, [])] * BLOCK


def test_streamed_logprobs_stop_where_a_stop_string_cuts_the_text(gateway):
    client, _, _ = gateway
    body = {
        "model": "tiny",
        "prompt": "copy : cat dog .",
        "max_tokens": 3 * BLOCK,
        "stop": ["dog"],
        "logprobs": 0,
    }
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    chunks = _events(client, "/v1/completions", body)
    objects = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    assert [v for o in objects for v in o["token_logprobs"]] == whole["logprobs"]["token_logprobs"]
    assert [t for o in objects for t in o["tokens"]] == whole["logprobs"]["tokens"]
    described = "".join(whole["logprobs"]["tokens"])  # the token the stop string cuts is not described
    assert whole["text"].startswith(described) and len(whole["text"]) - len(described) < len(" dog")


def test_a_client_that_goes_away_cancels_its_request(gateway):
    client, peer, _ = gateway
    peer.script = Script(wait_for_cancel_after=0)
    with pytest.raises(httpx.ReadTimeout):
        client.post(
            "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2 * BLOCK}, timeout=1
        )
    wait_for(lambda: peer.cancelled, what="the gateway to cancel the request of a client that left")


def test_a_streaming_client_that_goes_away_after_its_first_block_cancels_its_request(gateway):
    client, peer, _ = gateway
    peer.script = Script(wait_for_cancel_after=1)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 3 * BLOCK, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as reply:
        first = next(line for line in reply.iter_lines() if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["choices"][0]["text"]
    # the connection is closed here, with the rest of the answer not yet committed
    wait_for(lambda: peer.cancelled, what="the gateway to cancel the stream of a client that left")


def test_chat_logprobs_end_where_a_stop_string_cuts_the_answer(gateway):
    client, _, _ = gateway
    body = _chat_body(max_tokens=3 * BLOCK, stop=["dog"], logprobs=True)
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    described = "".join(c["token"] for c in whole["logprobs"]["content"])
    assert whole["finish_reason"] == "stop"
    assert whole["message"]["content"].startswith(described)
    assert len(whole["message"]["content"]) - len(described) < len(" dog")
    streamed = _events(client, "/v1/chat/completions", body)
    objects = [c["choices"][0]["logprobs"] for c in streamed if c["choices"][0]["logprobs"]]
    assert [c for o in objects for c in o["content"]] == whole["logprobs"]["content"]


def test_an_error_in_one_of_several_streamed_choices_ends_the_stream_with_it(gateway):
    client, peer, _ = gateway
    peer.script = Script(error="refused by the worker")
    chunks = _events(client, "/v1/completions", {"model": "tiny", "prompt": "hi", "n": 2})
    assert chunks == [{"error": _error("refused by the worker", "invalid_request_error")}]


@pytest.mark.gateway_settings(request_timeout_s=3)
def test_a_request_with_no_result_in_time_is_a_504_and_is_cancelled(gateway):
    client, peer, _ = gateway
    peer.script = Script(hold=True)
    reply = _completion(client)
    assert reply.status_code == 504
    assert reply.json()["error"] == _error("no result within 3 s", "timeout_error")
    wait_for(lambda: peer.cancellation_of(peer.held[0], patience_s=0), what="the cancellation")


@pytest.mark.gateway_settings(request_timeout_s=3)
def test_a_stream_with_no_result_in_time_ends_with_a_timeout_error_then_done(gateway):
    """Longer than one poll of the queue (2 s): the stream keeps waiting through empty polls."""
    client, peer, _ = gateway
    peer.script = Script(hold=True)
    chunks = _events(client, "/v1/completions", {"model": "tiny", "prompt": "hi"})
    assert [c["error"]["type"] for c in chunks] == ["timeout_error"]


def test_each_choice_asks_the_worker_for_its_sampling_seed_threshold_and_logprobs(gateway):
    client, peer, _ = gateway
    body = {"temperature": 0.7, "seed": 11, "n": 3, "threshold": 0.8, "logprobs": 2}
    assert _completion(client, **body).status_code == 200
    assert [q.params for q in peer.seen] == [
        RequestParams(max_tokens=16, temperature=0.7, seed=11 + i, threshold=0.8, logprobs=2)
        for i in range(3)
    ]
    assert all(q.id.startswith("cmpl-") for q in peer.seen) and len({q.id for q in peer.seen}) == 3
    peer.seen.clear()
    assert _completion(client, temperature=0.5, top_p=0.9, top_k=5, n=2).status_code == 200
    first, second = (q.params for q in peer.seen)
    assert (first.top_p, first.top_k, second.seed - first.seed) == (0.9, 5, 1)
    assert 0 <= first.seed < 2**62  # no seed given: one is drawn, choice i uses it + i
    peer.seen.clear()
    assert _completion(client).status_code == 200
    assert [q.params for q in peer.seen] == [RequestParams(max_tokens=16)]  # greedy, the service's settings


def test_a_greedy_request_sends_its_seed_and_its_sampler_settings(gateway):
    """A model whose canvases start from noise (DiffusionGemma) draws it with the seed, greedy or not; its
    family's settings go by name, only those set (the worker merges them over the model's)."""
    client, peer, _ = gateway
    body = {"seed": 7, "n": 2, "entropy_bound": 1, "t_min": 0.1, "max_denoising_steps": 4}
    assert _completion(client, **body).status_code == 200
    family = {"entropy_bound": 1.0, "t_min": 0.1, "max_denoising_steps": 4}
    assert [q.params for q in peer.seen] == [
        RequestParams(max_tokens=16, seed=7 + i, family=family) for i in range(2)
    ]
    assert type(peer.seen[0].params.family["entropy_bound"]) is float  # sent as 1: the setting's kind
    peer.seen.clear()
    assert _completion(client, n=2).status_code == 200  # greedy choices without a seed: drawn, one apart
    first, second = (q.params for q in peer.seen)
    assert first.greedy and second.seed - first.seed == 1


@pytest.mark.gateway_settings(max_prompt_tokens=8)
@pytest.mark.parametrize(
    "fields, status, param, message, code",
    [
        (
            {"model": "other"},
            404,
            "model",
            "the model 'other' does not exist; this service serves 'tiny'",
            "model_not_found",
        ),
        (
            {"block_length": 4},
            400,
            "block_length",
            f"block_length 4: this service decodes with block_length {BLOCK}",
            "invalid_value",
        ),
        (
            {"steps": 3},
            400,
            "steps",
            f"steps 3: this service decodes with {BLOCK} steps per block",
            "invalid_value",
        ),
        (
            {"max_tokens": 65},
            400,
            "max_tokens",
            "max_tokens 65 is above this service's limit of 64",
            "integer_above_max_value",
        ),
        (
            {"max_completion_tokens": 65},
            400,
            "max_completion_tokens",
            "max_completion_tokens 65 is above this service's limit of 64",
            "integer_above_max_value",
        ),
        ({"prompt": ""}, 400, "prompt", "the prompt is empty", "invalid_value"),
        (
            {"prompt": [3] * 9},
            400,
            "prompt",
            "the prompt has 9 tokens; this service accepts at most 8",
            "context_length_exceeded",
        ),
        ({"prompt": [3, 8]}, 400, "prompt", "prompt token ids must be in [0, {vocab})", "invalid_value"),
        (
            {"max_denoising_steps": BLOCK + 1},
            400,
            "max_denoising_steps",
            f"max_denoising_steps {BLOCK + 1} is above this service's {BLOCK} steps per block",
            "integer_above_max_value",
        ),
        ({"t_min": 0.5, "t_max": 0.5}, 400, "t_max", "t_max 0.5 must be above t_min 0.5", "invalid_value"),
        (
            {"entropy_bound": 0},
            400,
            "entropy_bound",
            "entropy_bound: Input should be greater than 0",
            "decimal_below_min_value",
        ),
    ],
)
def test_a_request_the_service_cannot_run_is_refused_naming_its_field(
    gateway, fields, status, param, message, code
):
    client, peer, tokenizer = gateway
    vocab = tokenizer.tokenizer.get_vocab_size()
    if fields.get("prompt") == [3, 8]:
        fields = {"prompt": [3, vocab]}  # one past the last token id
    reply = _completion(client, **fields)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert (error["param"], error["message"], error["code"]) == (param, message.format(vocab=vocab), code)
    assert peer.seen == []


@contextlib.contextmanager
def _held_request_of_a_client_who_leaves(client: httpx.Client, peer: ScriptedPeer, patience_s: float = 3):
    """Another client's request, claimed and held by the peer, while the block runs; that client leaves
    after ``patience_s`` (the gateway then cancels the request) and the block's end waits for it."""
    peer.script = Script(hold=True)
    with httpx.Client(base_url=str(client.base_url), timeout=patience_s) as other:

        def wait_in_vain() -> None:
            with contextlib.suppress(httpx.TimeoutException):
                _completion(other)

        waiting = threading.Thread(target=wait_in_vain, daemon=True)
        waiting.start()
        wait_for(lambda: peer.held, what="the request to be claimed")
        yield
        waiting.join(timeout=30)


@pytest.mark.gateway_settings(max_queued=1, retry_after_s=7)
def test_a_full_queue_is_a_429_with_retry_after(gateway):
    client, peer, _ = gateway
    with _held_request_of_a_client_who_leaves(client, peer):  # the first request stays in flight
        reply = _completion(client)
    assert reply.status_code == 429 and reply.headers["retry-after"] == "7"
    assert reply.json()["error"] == _error(
        "the queue is full; retry later", "rate_limit_error", "rate_limit_exceeded"
    )


@pytest.mark.gateway_settings(max_prompt_tokens=8)
def test_a_prompt_at_the_limit_and_the_last_token_id_are_accepted(gateway):
    client, peer, tokenizer = gateway
    last = tokenizer.tokenizer.get_vocab_size() - 1
    assert _completion(client, prompt=[3] * 7 + [last]).status_code == 200
    assert [q.prompt_ids for q in peer.seen] == [[3] * 7 + [last]]


@pytest.mark.gateway_settings(enqueue_timeout_s=1.5, retry_after_s=7)
def test_an_enqueue_rides_out_a_redis_restart_and_gives_up_with_a_503_after_its_timeout(
    gateway, redis_server
):
    """Redis killed: the request is tried again until ``enqueue_timeout_s``, then refused with a 503 and
    Retry-After (never a 500); Redis back within that time: the request is accepted and answered."""
    client, _, tokenizer = gateway
    redis_server.kill()
    refused = _completion(client, max_tokens=BLOCK)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "7"
    assert refused.json()["error"] == _error(
        "the request was not accepted: the queue is unreachable; retry later", "server_error"
    )
    revived = RedisServer(port=redis_server.port)
    restart = threading.Timer(0.5, revived.start)
    restart.start()
    try:
        reply = _completion(client, max_tokens=BLOCK)
    finally:
        restart.join()
        revived.stop()
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == tokenizer.decode(tokenizer.encode(ANSWER)[:BLOCK])


def _streamed_error(url: str, body: dict) -> list:
    with httpx.Client(base_url=url, timeout=30) as client:
        return _events(client, "/v1/completions", body)


def test_sigterm_ends_waiting_requests_with_a_503_and_streams_with_an_error_then_done(
    served_model, redis_server, service
):
    """``python -m gateway``'s SIGTERM handler (called as the signal would): with a drain of 0 s the
    requests waiting on a worker that never answers end at once, each cancelled; a new client is told to
    retry."""
    tokenizer = GatewayTokenizer(str(served_model))
    peer = ScriptedPeer(redis_server.url, service, tokenizer, Script(hold=True))
    settings = gateway_settings(served_model, redis_server.url, service, drain_timeout_s=0, retry_after_s=7)
    body = {"model": "tiny", "prompt": "copy : cat dog ."}
    with GatewayServer(settings) as server, ThreadPoolExecutor(2) as pool:
        peer.start()
        try:
            plain = pool.submit(lambda: httpx.post(f"{server.url}/v1/completions", json=body, timeout=30))
            streamed = pool.submit(_streamed_error, server.url, body)
            wait_for(lambda: len(peer.held) == 2, what="both requests to be claimed")
            server.terminate()
            reply, chunks = plain.result(timeout=30), streamed.result(timeout=30)
            assert all(peer.cancellation_of(request_id, patience_s=5) for request_id in peer.held)
        finally:
            peer.halt.set()
            peer.join(timeout=10)
    error = _error("the gateway is shutting down; retry the request", "server_error")
    assert reply.status_code == 503 and reply.headers["retry-after"] == "7"
    assert reply.json()["error"] == error
    assert chunks == [{"error": error}]


def _waiting(client: httpx.Client) -> float:
    """The gateway's ``dllm_gateway_waiting_requests`` gauge."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("dllm_gateway_waiting_requests "):
            return float(line.split()[1])
    raise AssertionError("no dllm_gateway_waiting_requests in /metrics")


def test_a_finished_request_leaves_no_waiter_behind_and_its_events_expire_within_a_minute(gateway):
    client, peer, _ = gateway
    with _held_request_of_a_client_who_leaves(client, peer):
        assert _waiting(client) == 1
    wait_for(lambda: _waiting(client) == 0, what="the gateway to stop waiting for the request")
    peer.script, peer.seen = Script(), []
    assert _completion(client).status_code == 200
    wait_for(lambda: _waiting(client) == 0, what="the delivered request's waiter to leave")
    events_key = peer.queue.ops.keys.events(peer.seen[0].id)
    wait_for(lambda: 0 < peer.queue.redis.ttl(events_key) <= 60, what="the events' retention cut")


def test_the_largest_seed_wraps_to_zero_and_drawn_seeds_differ(gateway):
    """Seeds are in [0, 2**63) (the worker refuses others): choice i draws with (seed + i) mod 2**63; a
    sampled request without a seed draws its own, different from the others'."""
    client, peer, _ = gateway
    assert _completion(client, temperature=0.7, seed=2**63 - 1, n=2).status_code == 200
    assert sorted(q.params.seed for q in peer.seen) == [0, 2**63 - 1]
    peer.seen.clear()
    for _ in range(40):
        assert _completion(client, temperature=0.7, max_tokens=BLOCK).status_code == 200
    assert len({q.params.seed for q in peer.seen}) == 40


def test_streamed_usage_counts_each_choices_tokens_up_to_its_stop(gateway):
    client, peer, tokenizer = gateway
    body = _completion_body(max_tokens=4 * BLOCK, n=2, stop=["dog"], stream_options={"include_usage": True})
    *chunks, last = _events(client, "/v1/completions", body)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert reasons == ["stop", "stop"]
    prompt = len(tokenizer.encode("copy : cat dog ."))
    texts = ["", ""]
    for chunk in chunks:
        texts[chunk["choices"][0]["index"]] += chunk["choices"][0]["text"]
    # "dog" is in each answer's second block, after which its request is cancelled; the usage counts the
    # tokens of the text returned (up to the one the cut falls in), as the answer without a stream does
    tokens = peer.tokens_for(QueuedRequest("x", [1], RequestParams(max_tokens=4 * BLOCK), 0))
    shown = [_covering(tokenizer, tokens, text) for text in texts]
    assert BLOCK < shown[0] < 2 * BLOCK and shown[0] == shown[1]
    assert last["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": sum(shown),
        "total_tokens": prompt + sum(shown),
    }
    whole = client.post("/v1/completions", json=body | {"stream": False, "stream_options": None}).json()
    assert whole["usage"] == last["usage"]


def _covering(tokenizer, tokens: list[int], text: str) -> int:
    """How many tokens the text returned counts: the fewest whose text is as long as it."""
    return next(k for k in range(len(tokens) + 1) if len(tokenizer.decode(tokens[:k])) >= len(text))


def test_after_a_lost_block_the_result_brings_the_stop_and_the_log_probabilities(gateway):
    """Block 0's event lost: no block chunk goes out; the result's text is cut at the stop string, and its
    log probabilities are the ones recorded, as in the answer without a stream."""
    client, peer, _ = gateway
    body = _completion_body(max_tokens=3 * BLOCK, stop=["dog"], logprobs=1)
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    peer.script = Script(skip_block=0)
    chunks = _events(client, "/v1/completions", body)
    assert len(chunks) == 2  # the text the result brings, then the reason
    assert chunks[0]["choices"][0]["text"] == whole["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"] == "stop"
    assert _joined_logprobs(chunks) == whole["logprobs"]


SILENT = "the cat . a b c d e" + " <|user|>" * BLOCK + " f the blue dog ."  # block 1 shows no text


def test_a_block_that_shows_no_text_streams_its_log_probabilities_with_empty_text(gateway):
    client, peer, _ = gateway
    peer.script = Script(text=SILENT)
    body = {"model": "tiny", "prompt": "copy : cat dog .", "max_tokens": 2 * BLOCK, "logprobs": 0}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    assert whole["text"] == "the cat . a b c d e" and whole["logprobs"]["tokens"][BLOCK:] == [""] * BLOCK
    chunks = _events(client, "/v1/completions", body)
    assert [c["choices"][0]["text"] for c in chunks] == [whole["text"], "", ""]
    assert _joined_logprobs(chunks) == whole["logprobs"]
    streamed = _events(client, "/v1/chat/completions", _chat_body(max_tokens=2 * BLOCK, logprobs=True))
    assert [c["choices"][0]["delta"] for c in streamed] == [
        {"role": "assistant", "content": "the cat . a b c d e"},  # the role in the first chunk only
        {"content": ""},
        {},
    ]
    assert [len(c["choices"][0]["logprobs"]["content"]) for c in streamed[:2]] == [BLOCK, BLOCK]


def test_logprobs_describe_exactly_a_text_that_a_stop_string_cut_at_a_token_boundary(gateway):
    client, _, _ = gateway
    body = _completion_body(max_tokens=3 * BLOCK, stop=[" dog"], logprobs=0)
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    assert whole["text"] == "the cat . a b c d e f the blue"
    assert "".join(whole["logprobs"]["tokens"]) == whole["text"]
    assert _joined_logprobs(_events(client, "/v1/completions", body)) == whole["logprobs"]
    chat_body = _chat_body(max_tokens=3 * BLOCK, stop=[" dog"], logprobs=True)
    chat = client.post("/v1/chat/completions", json=chat_body).json()["choices"][0]
    assert "".join(c["token"] for c in chat["logprobs"]["content"]) == chat["message"]["content"]


def _byte_level_model(served_model, directory: Path) -> Path:
    """The served model's files with a byte-level BPE tokenizer without merges: every byte is a token, so a
    character outside ASCII takes two to four tokens and a block can end inside one (LLaDA's and Dream's
    tokenizers are byte-level BPE too). The special tokens keep their ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    shutil.copytree(served_model, directory)
    specials = ["<unk>", "<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "<|user|>", "<|assistant|>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(specials)}
    vocab |= {byte: len(specials) + i for i, byte in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


WIDE = "abcdefgé wö 你好 ün"  # 24 bytes: block 0 ends inside "é", block 1 inside "你"


def test_characters_split_across_blocks_stream_whole_with_their_log_probabilities(
    served_model, redis_server, service, tmp_path
):
    """A block that ends inside a character: its bytes wait for the block that completes it (never a
    U+FFFD sent and then contradicted); the streamed text and log probabilities are the whole answer's."""
    model = _byte_level_model(served_model, tmp_path / "byte-level")
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 3 * BLOCK, "logprobs": 0}
    chat_body = _chat_body(max_tokens=3 * BLOCK, logprobs=True)
    with _stack(model, redis_server.url, service) as (client, peer, tokenizer):
        peer.script = Script(text=WIDE)
        whole = client.post("/v1/completions", json=body).json()["choices"][0]
        chunks = _events(client, "/v1/completions", body)
        chat = client.post("/v1/chat/completions", json=chat_body).json()["choices"][0]
        chat_chunks = _events(client, "/v1/chat/completions", chat_body)
    assert len(tokenizer.encode(WIDE)) == 3 * BLOCK and "\ufffd" in tokenizer.decode(
        tokenizer.encode(WIDE)[:BLOCK]
    )
    assert whole["text"] == chat["message"]["content"] == WIDE
    assert [c["choices"][0]["text"] for c in chunks] == ["abcdefg", "é wö ", "你好 ün", ""]
    assert "".join(whole["logprobs"]["tokens"]) == WIDE
    assert _joined_logprobs(chunks) == whole["logprobs"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chat_chunks) == WIDE
    assert "".join(c["token"] for c in chat["logprobs"]["content"]) == WIDE
    streamed = [
        c
        for chunk in chat_chunks
        if chunk["choices"][0]["logprobs"]
        for c in chunk["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == chat["logprobs"]["content"]


def test_a_text_that_ends_inside_a_character_streams_as_it_is_answered(
    served_model, redis_server, service, tmp_path
):
    """A text cut inside a character (by max_tokens, or by a stop string after a byte sequence that is not
    UTF-8) ends with U+FFFD, streamed too: the held-back bytes go out with the end of the answer."""
    model = _byte_level_model(served_model, tmp_path / "byte-level")
    with _stack(model, redis_server.url, service) as (client, peer, tokenizer):
        peer.script = Script(text=WIDE)
        cut = {"model": "tiny", "prompt": "hi", "max_tokens": BLOCK}  # the 8th token is half of "é"
        whole = client.post("/v1/completions", json=cut).json()["choices"][0]
        chunks = _events(client, "/v1/completions", cut)
        stray_byte = tokenizer.encode("é")[0]
        peer.script = Script(
            tokens=tokenizer.encode("abcdefg") + [stray_byte] + tokenizer.encode("x wö 你好 ün")
        )
        stop = {"model": "tiny", "prompt": "hi", "max_tokens": 3 * BLOCK, "stop": ["x"]}
        stopped = client.post("/v1/completions", json=stop).json()["choices"][0]
        stopped_chunks = _events(client, "/v1/completions", stop)
    assert whole["text"] == "abcdefg\ufffd" == "".join(c["choices"][0]["text"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert stopped["text"] == "abcdefg\ufffd" == "".join(c["choices"][0]["text"] for c in stopped_chunks)
    assert stopped_chunks[-1]["choices"][0]["finish_reason"] == "stop"
