"""DiffusionGemma's sampler settings (families/diffusion_gemma/sampler_settings.py): validated as the
reference's generation config validates them, a request's merged over the service's, and the one source of
the API's request fields (through the family table) and of ``dllm generate``'s flags."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from dllm_contracts.family_table import FAMILY_TABLE
from dllm_contracts.request_params import FAMILY_SETTINGS
from dllm_contracts.request_setting import Setting, SettingError, settings_of
from engine_pod.families.diffusion_gemma.family import FAMILY
from engine_pod.families.diffusion_gemma.sampler_settings import EntropyBoundParams
from gateway.schemas import CompletionRequest

SERVICE = EntropyBoundParams(max_denoising_steps=16, t_max=1.5)
SETTINGS = settings_of(EntropyBoundParams)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"max_denoising_steps": 0}, "max_denoising_steps must be >= 1"),
        ({"max_denoising_steps": 2.0}, "max_denoising_steps must be an integer"),
        ({"entropy_bound": 0.0}, "entropy_bound must be > 0"),
        ({"entropy_bound": math.inf}, "entropy_bound must be > 0, got inf"),
        ({"confidence_threshold": math.nan}, "confidence_threshold must be > 0"),
        ({"t_min": -0.1}, "t_min must be >= 0"),
        ({"t_min": 0.8, "t_max": 0.8}, "t_max 0.8 must be above t_min 0.8"),
        ({"stability_threshold": -1}, "stability_threshold must be >= 0"),
        ({"stability_threshold": True}, "stability_threshold must be an integer"),
        ({"entropy_bound": "0.5"}, "entropy_bound must be a number"),
    ],
)
def test_settings_out_of_range_are_refused_by_name(values, message):
    with pytest.raises(SettingError, match=message) as refused:
        EntropyBoundParams(**values)
    assert refused.value.param in values


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
        ({"max_denoising_steps": 17}, "max_denoising_steps 17 is above this service's 16 steps per block"),
        ({"t_min": 1.5}, "t_max 1.5 must be above t_min 1.5"),  # valid alone, not under the service's t_max
        ({"temperature": 0.5}, "unknown settings: temperature"),
        ({"entropy_bound": -1.0}, "entropy_bound must be > 0"),
    ],
)
def test_a_request_cannot_leave_the_ranges_or_ask_more_steps_than_the_service(settings, message):
    with pytest.raises(SettingError, match=message):
        SERVICE.for_request(settings)


def test_the_family_declares_them_and_the_family_table_carries_them_to_the_gateway():
    """The record names the class; the generated table holds each declaration as data, read back equal."""
    assert FAMILY.request_params is EntropyBoundParams
    (row,) = [row for row in FAMILY_TABLE if row["name"] == FAMILY.name]
    assert tuple(map(Setting.from_row, row["request_settings"])) == tuple(SETTINGS.values())
    assert {name: FAMILY_SETTINGS[name] for name in SETTINGS} == SETTINGS


def test_the_api_fields_are_the_settings_with_their_ranges():
    """Every setting is a completions (and chat) body field, refused where the class refuses it, accepted
    at its bound, and sent on by name with its kind."""
    fields = CompletionRequest.model_fields
    base = {"model": "m", "prompt": "hi"}
    for name, declared in SETTINGS.items():
        assert fields[name].annotation == (declared.kind | None)
        assert fields[name].description.startswith("DiffusionGemma: ")
        with pytest.raises(ValidationError):
            CompletionRequest(**base, **{name: declared.low - (1 if not declared.low_open else 0)})
        if not declared.low_open:
            at_bound = CompletionRequest(**base, **{name: declared.kind(declared.low)})
            assert at_bound.family_settings() == {name: declared.low}
    body = CompletionRequest(**base, entropy_bound=1, t_min=0.1)
    assert body.family_settings() == {"entropy_bound": 1.0, "t_min": 0.1}
    assert type(body.family_settings()["entropy_bound"]) is float
    assert CompletionRequest(**base).family_settings() == {}
    for name in ("entropy_bound", "t_max", "confidence_threshold"):
        with pytest.raises(ValidationError, match="finite"):
            CompletionRequest(**base, **{name: math.inf})
