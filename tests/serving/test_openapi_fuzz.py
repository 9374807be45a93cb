"""Schema-driven fuzzing of the gateway: no input produces a 5xx, and no body OpenAI would refuse gets a 2xx.

Three parts: inputs valid by the gateway's OpenAPI document (no 5xx); inputs that break it (schemathesis'
negative mode: a 4xx, never a 2xx, since the document says what OpenAI's does: no unknown fields, at most
four stops, no coercion); and bodies built from a valid one plus one thing OpenAI refuses (an unknown
field, a field we do not implement with a value that does something, a fifth stop, a string where a
boolean goes, an image part), each a 400 naming it. CI runs a few examples of each; ``-m slow`` many more.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from dllm_contracts.request_params import FAMILY_SETTINGS
from gateway.openai_fields import CHAT_ONLY, HARMLESS
from tests.serving.conftest import WorkerThread  # noqa: F401 (fixture plumbing)
from tests.serving_utils import GatewayServer, gateway_settings

CI_EXAMPLES, FULL_EXAMPLES = 25, 300


@pytest.fixture
def api_schema(served_model, redis_server, service, make_worker):
    settings_ = gateway_settings(served_model, redis_server.url, service, request_timeout_s=60)
    with GatewayServer(settings_) as gateway, make_worker(redis_server.url, service):
        yield schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")


@pytest.fixture
def negative_schema(api_schema):
    """The same document, drawn from outside it: every input breaks it somewhere."""
    api_schema.config.generation.update(modes=[GenerationMode.NEGATIVE])
    return api_schema


schema = schemathesis.pytest.from_fixture("api_schema")
# JSON bodies (a multipart upload carries bytes: a "boolean" file is a 5-byte file, for OpenAI too)
negative = schemathesis.pytest.from_fixture("negative_schema").include(
    method="POST", path=["/v1/completions", "/v1/chat/completions", "/v1/batches"]
)
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck))


def _no_server_error(case) -> None:
    response = case.call(timeout=120)
    assert response.status_code < 500, (
        f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    )


def _refused(case) -> None:
    response = case.call(timeout=120)
    assert 400 <= response.status_code < 500, (
        f"{case.method} {case.path} with {case.body!r:.300} -> {response.status_code}: {response.text[:300]}"
    )


@schema.parametrize()
@settings(FUZZ, max_examples=CI_EXAMPLES)
def test_no_input_makes_the_gateway_fail(case):
    _no_server_error(case)


@negative.parametrize()
@settings(FUZZ, max_examples=CI_EXAMPLES)
def test_no_input_against_the_document_is_accepted(case):
    _refused(case)


@pytest.mark.slow
@schema.parametrize()
@settings(FUZZ, max_examples=FULL_EXAMPLES)
def test_no_input_makes_the_gateway_fail_many_examples(case):
    _no_server_error(case)


@pytest.mark.slow
@negative.parametrize()
@settings(FUZZ, max_examples=FULL_EXAMPLES)
def test_no_input_against_the_document_is_accepted_many_examples(case):
    _refused(case)


# What OpenAI refuses in an otherwise valid chat body: (strategy of the changed body, the param named)
BASE = {"model": "tiny", "messages": [{"role": "user", "content": "count to 3 ."}], "max_tokens": 8}
_KNOWN = {"stop", "stream", "stream_options", "logprobs", "top_logprobs", "n", "seed", "temperature", "top_p"}
_KNOWN |= {"top_k", "user", "max_completion_tokens", "block_length", "steps", "threshold", "name"}
_KNOWN |= set(FAMILY_SETTINGS)  # model families' settings (a model of another family refuses them)
names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=6,
)
unknown = names.filter(lambda n: n not in BASE and n not in HARMLESS and n not in _KNOWN).flatmap(
    lambda name: json_values.map(lambda value: ({name: value}, name))
)
unsupported = st.sampled_from(CHAT_ONLY + ("logit_bias", "presence_penalty", "frequency_penalty")).flatmap(
    lambda name: json_values.filter(lambda v, n=name: v is not None and not _harmless(n, v)).map(
        lambda value, n=name: ({n: value}, n)
    )
)
stops = st.lists(st.text(min_size=1, max_size=4), min_size=5, max_size=8).map(lambda s: ({"stop": s}, "stop"))
coerced = st.sampled_from(
    [
        ({"stream": "true"}, "stream"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"n": 1.0}, "n"),
        ({"temperature": "0.5"}, "temperature"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ]
)
images = st.sampled_from(["image_url", "input_audio", "file"]).map(
    lambda kind: (
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": kind, kind: {}}]}
            ]
        },
        "messages[0].content",
    )
)
refusals = st.one_of(unknown, unsupported, stops, coerced, images)


def _harmless(name: str, value) -> bool:
    try:
        return HARMLESS[name](value)
    except TypeError:  # a value of the wrong type: refused for its type, which is what we want here too
        return False


@pytest.fixture(scope="module")
def bare_gateway(tmp_path_factory):
    """A gateway with no worker: a refused body never reaches the queue, and nothing else is sent."""
    from engine_pod.serve.redis_server import RedisServer
    from tests.serving_utils import write_served_model

    model = write_served_model(tmp_path_factory.mktemp("fuzz-model"))
    redis = RedisServer().start()
    try:
        with (
            GatewayServer(gateway_settings(model, redis.url, "fuzz")) as gateway,
            httpx.Client(base_url=gateway.url, timeout=30) as client,
        ):
            yield client
    finally:
        redis.stop()


def _check_refusal(client: httpx.Client, change: tuple[dict, str]) -> None:
    fields, param = change
    reply = client.post("/v1/chat/completions", json=BASE | fields)
    assert reply.status_code == 400, f"{fields!r:.300} -> {reply.status_code}: {reply.text[:300]}"
    named = reply.json()["error"]["param"] or ""
    assert named == param or named.startswith((f"{param}.", f"{param}[")), reply.text[:300]


@given(change=refusals)
@settings(FUZZ, max_examples=60)
def test_a_body_openai_refuses_is_a_400_naming_what_is_wrong(bare_gateway, change):
    _check_refusal(bare_gateway, change)


@pytest.mark.slow
@given(change=refusals)
@settings(FUZZ, max_examples=1000)
def test_a_body_openai_refuses_is_a_400_naming_what_is_wrong_many_examples(bare_gateway, change):
    _check_refusal(bare_gateway, change)
