"""The request contract (dllm_contracts/request_params.py): one object, checked when it is built, that the
queue's payload carries as it is, and reads back from what an older gateway queued."""

from __future__ import annotations

import json
import math

import orjson
import pytest

from dllm_contracts.queue.messages import QueuedRequest
from dllm_contracts.request_params import FAMILY_SETTINGS, GREEDY, RequestParams, family_settings_error
from dllm_contracts.request_setting import SettingError
from engine_pod.families.diffusion_gemma.sampler_settings import EntropyBoundParams


@pytest.mark.parametrize(
    "values, message",
    [
        ({"temperature": 2.5}, "temperature must be in [0, 2], got 2.5"),
        ({"temperature": math.nan}, "temperature must be in [0, 2], got nan"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_k": -1}, "top_k must be >= 0, got -1"),
        ({"top_k": 1.5}, "top_k must be an integer, got 1.5"),
        ({"seed": 2**63}, "seed must be in [0, 9223372036854775808), got 9223372036854775808"),
        ({"threshold": 0.0}, "threshold must be in (0, 1], got 0.0"),
        ({"logprobs": 21}, "logprobs must be in [0, 20], got 21"),
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"family": {"t_min": -1.0}}, "t_min must be >= 0, got -1.0"),
        ({"family": {"t_max": 0.5, "t_min": 0.5}}, "t_max 0.5 must be above t_min 0.5"),
        ({"family": {"speculation": 1}}, "unknown request settings: speculation"),
    ],
)
def test_a_setting_out_of_its_range_is_refused_naming_it(values, message):
    with pytest.raises(SettingError) as refused:
        RequestParams(**values)
    assert str(refused.value) == message
    assert refused.value.param == next(iter(values.get("family", values)))


def test_the_bounds_themselves_are_valid():
    RequestParams(max_tokens=1, temperature=2, top_p=1, top_k=0, seed=2**63 - 1, threshold=1, logprobs=20)


def test_the_payload_carries_what_differs_from_the_defaults_and_reads_back_the_same():
    params = RequestParams(max_tokens=40, temperature=0.5, seed=9, logprobs=2, family={"t_min": 0.1})
    queued = QueuedRequest("cmpl-1", [5, 6], params, 1.5, meta={"custom_id": "a"})
    payload = orjson.loads(queued.to_json())
    assert payload["max_tokens"] == 40  # where every version reads it
    assert payload["params"] == {"temperature": 0.5, "seed": 9, "logprobs": 2, "family": {"t_min": 0.1}}
    assert QueuedRequest.read(queued.to_json()) == (queued, [], None)
    greedy = QueuedRequest("cmpl-2", [5], RequestParams(max_tokens=8), 1.5)
    assert "params" not in orjson.loads(greedy.to_json())  # a worker older than params serves it


def test_a_payload_an_older_gateway_queued_reads_into_the_same_settings():
    """Before ``params`` the settings were top-level fields: threshold, sampling, logprobs, sampler."""
    older = {
        "id": "cmpl-1",
        "prompt_ids": [5, 6],
        "max_tokens": 40,
        "created": 1.5,
        "threshold": 0.8,
        "stream": True,
        "meta": {},
        "sampling": {"temperature": 0.5, "top_p": 0.9, "top_k": 3, "seed": 9},
        "logprobs": 2,
        "sampler": {"entropy_bound": 1.0},
        "model": None,
    }
    request, unknown, invalid = QueuedRequest.read(json.dumps(older))
    assert (unknown, invalid, request.stream) == ([], None, True)
    assert request.params == RequestParams(
        max_tokens=40, temperature=0.5, top_p=0.9, top_k=3, seed=9, threshold=0.8, logprobs=2,
        family={"entropy_bound": 1.0},
    )  # fmt: skip
    plain = {key: older[key] for key in ("id", "prompt_ids", "max_tokens", "created")} | {"sampling": None}
    assert QueuedRequest.read(json.dumps(plain))[0].params == RequestParams(max_tokens=40)


def test_a_payload_with_invalid_settings_is_read_and_says_why():
    """Another client of the queue: the worker refuses the request with the reason, instead of failing
    every claim that holds it."""
    payload = {"id": "r", "prompt_ids": [5], "max_tokens": 8, "created": 0, "params": {"top_p": 7.0}}
    request, unknown, invalid = QueuedRequest.read(json.dumps(payload))
    assert (request.id, unknown, invalid) == ("r", [], "top_p must be in (0, 1], got 7.0")
    newer = payload | {"params": {"min_p": 0.1}, "speculation": {}}
    assert QueuedRequest.read(json.dumps(newer))[1:] == (["speculation"], "unknown request settings: min_p")


def test_a_family_takes_only_its_own_settings_merged_over_the_services():
    service = EntropyBoundParams(max_denoising_steps=16)
    assert family_settings_error({}, None, "LLaDA") is None
    assert (
        family_settings_error({"t_min": 0.1}, None, "LLaDA") == "t_min: not a setting of LLaDA; leave it out"
    )
    assert family_settings_error({"t_min": 0.1}, service, "DiffusionGemma") is None
    assert family_settings_error({"t_min": 0.9}, service, "DiffusionGemma") == (
        "invalid request settings: t_max 0.8 must be above t_min 0.9"
    )
    assert family_settings_error({"max_denoising_steps": 17}, service, "DiffusionGemma") == (
        "invalid request settings: max_denoising_steps 17 is above this service's 16 steps per block"
    )
    assert set(FAMILY_SETTINGS) >= {"entropy_bound", "t_min", "t_max", "max_denoising_steps"}
    assert GREEDY.greedy and GREEDY.to_wire() == {}
