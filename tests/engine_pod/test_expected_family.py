"""A caller that names the family it expects (``--family``, a DLLMService's spec.model.family) gets a
checkpoint of another family refused in one line, before any weight is read or built."""

from __future__ import annotations

import pytest

import engine_pod.loading.loader as loader
import engine_pod.loading.sharded as sharded
from dllm_contracts.families import FAMILIES
from dllm_contracts.model_source import ModelLoadError
from engine_pod.bench.results import ModelSpec
from engine_pod.families.registry import family_names
from engine_pod.profiling.profiler import ProfileConfig, for_model


@pytest.fixture
def no_weights(monkeypatch):
    """Reading or building weights fails the test: a refusal must come before either."""

    def read(*args, **kwargs):
        raise AssertionError("weights were read or built before the family was checked")

    monkeypatch.setattr(sharded, "build_part", read)  # builds a model (a rank's part)
    monkeypatch.setattr(sharded, "fill_model", read)  # reads or draws its weights


@pytest.mark.parametrize(
    ("spec", "family", "expected"),
    [("builtin:tiny-llada", "llada", "dream"), ("random:dream-7b", "dream", "llada")],
)
def test_a_checkpoint_of_another_family_is_refused_before_its_weights(no_weights, spec, family, expected):
    message = f"{spec} is a {family} checkpoint, not the {expected} one expected"
    with pytest.raises(ModelLoadError, match=message) as metadata:
        loader.load_metadata(spec, expected)
    with pytest.raises(ModelLoadError, match=message) as model:
        loader.load_model(spec, family=expected)
    for refusal in (metadata, model):
        assert "\n" not in str(refusal.value)


def test_the_expected_family_or_none_loads():
    assert loader.load_metadata("builtin:tiny-llada", "llada")[0].family == "llada"
    assert loader.load_metadata("random:dream-7b")[0].family == "dream"
    assert loader.load_model("random:llada-tiny", family="llada").config.family == "llada"


def test_benchmarks_and_the_profiler_load_with_the_family_they_were_given(no_weights):
    spec = ModelSpec("builtin:tiny-llada", "cpu", "float32", family="dream")
    with pytest.raises(ModelLoadError, match="a llada checkpoint, not the dream one"):
        spec.metadata()
    with pytest.raises(ModelLoadError, match="a llada checkpoint, not the dream one"), spec.loaded(seed=0):
        pass
    with pytest.raises(ModelLoadError, match="a llada checkpoint, not the dream one"):
        for_model(ProfileConfig(model="builtin:tiny-llada", family="dream"))


def test_the_command_lines_choices_are_the_registrys_families():
    """``--family`` takes its choices from dllm_contracts (the command line starts without torch)."""
    assert family_names() == FAMILIES
