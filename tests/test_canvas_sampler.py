"""DiffusionGemma's sampler settings (dllm_contracts/canvas_sampler.py): validated as the reference's
generation config validates them, a request's merged over the service's, and the one source of the
API's request fields and of ``dllm generate``'s flags."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from dllm_contracts.canvas_sampler import SETTINGS, EntropyBoundParams
from gateway.schemas import CompletionRequest

SERVICE = EntropyBoundParams(max_denoising_steps=16, t_max=1.5)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"max_denoising_steps": 0}, "max_denoising_steps must be >= 1"),
        ({"max_denoising_steps": 2.0}, "max_denoising_steps must be an integer"),
        ({"entropy_bound": 0.0}, "entropy_bound must be > 0"),
        ({"entropy_bound": math.inf}, "entropy_bound must be > 0, got inf"),
        ({"confidence_threshold": math.nan}, "confidence_threshold must be > 0"),
        ({"t_min": -0.1}, "t_min must be >= 0"),
        ({"t_min": 0.8, "t_max": 0.8}, "need t_min < t_max"),
        ({"stability_threshold": -1}, "stability_threshold must be >= 0"),
        ({"stability_threshold": True}, "stability_threshold must be an integer"),
        ({"entropy_bound": "0.5"}, "entropy_bound must be a number"),
    ],
)
def test_settings_out_of_range_are_refused_by_name(values, message):
    with pytest.raises(ValueError, match=message):
        EntropyBoundParams(**values)


def test_the_reference_defaults_and_the_bounds_themselves_are_valid():
    assert EntropyBoundParams() == EntropyBoundParams(48, 0.1, 0.4, 0.8, 1, 0.005)
    EntropyBoundParams(max_denoising_steps=1, t_min=0.0, t_max=1e-9, stability_threshold=0)


def test_a_requests_settings_replace_the_services_and_the_rest_stay():
    assert SERVICE.for_request(None) is SERVICE and SERVICE.for_request({}) is SERVICE
    merged = SERVICE.for_request({"entropy_bound": 2.0, "max_denoising_steps": 4})
    assert (merged.entropy_bound, merged.max_denoising_steps, merged.t_max) == (2.0, 4, 1.5)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"max_denoising_steps": 17}, "above this service's 16 steps per canvas"),
        ({"t_min": 1.5}, "need t_min < t_max"),  # valid alone, not under the service's t_max
        ({"temperature": 0.5}, "unknown sampler settings: temperature"),
        ({"entropy_bound": -1.0}, "entropy_bound must be > 0"),
    ],
)
def test_a_request_cannot_leave_the_ranges_or_ask_more_steps_than_the_service(settings, message):
    with pytest.raises(ValueError, match=message):
        SERVICE.for_request(settings)


def test_the_api_fields_are_the_settings_with_their_ranges():
    """Every setting is a completions (and chat) body field, refused where the config class refuses it,
    accepted at its bound, and sent on by name with its type."""
    fields = CompletionRequest.model_fields
    base = {"model": "m", "prompt": "hi"}
    for name, bound in SETTINGS.items():
        assert fields[name].annotation == (bound.kind | None)
        with pytest.raises(ValidationError):
            CompletionRequest(**base, **{name: bound.low - (0 if not bound.inclusive else 1)})
        if bound.inclusive:
            assert CompletionRequest(**base, **{name: bound.kind(bound.low)}).sampler_settings() == {
                name: bound.low
            }
    body = CompletionRequest(**base, entropy_bound=1, t_min=0.1)
    assert body.sampler_settings() == {"entropy_bound": 1.0, "t_min": 0.1}
    assert type(body.sampler_settings()["entropy_bound"]) is float
    assert CompletionRequest(**base).sampler_settings() is None
    for name in ("entropy_bound", "t_max", "confidence_threshold"):
        with pytest.raises(ValidationError, match="finite"):
            CompletionRequest(**base, **{name: math.inf})
