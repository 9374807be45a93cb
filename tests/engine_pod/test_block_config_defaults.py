"""A block-diffusion config.json that leaves a field out is read with the default of the family's
reference configuration class: each optional field dropped in turn, the model loads and computes what
that default implies (the reference checkpoint's own logits where the default is the value it was made
with; the logits of the default written out otherwise)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine_pod.families.llada2 import LLADA2_DEFAULTS
from engine_pod.families.sdar import SDAR_DEFAULTS
from engine_pod.loading.config_readers import config_from_dict
from engine_pod.loading.loader import build_model, load_model
from engine_pod.models.config import ModelConfigError
from tests.engine_utils import block_causal_logits
from tests.factories import BLOCK_REFERENCE_DIR, write_checkpoint

DEFAULTS = {"llada2": LLADA2_DEFAULTS, "sdar": SDAR_DEFAULTS}
FIXED = {  # a value each family's reference modelling does not implement
    "llada2": {
        "score_function": "softmax",
        "norm_topk_prob": False,
        "norm_head": True,
        "tie_word_embeddings": True,
        "use_sliding_window": True,
        "rope_scaling": {"type": "linear"},
    },
    "sdar": {"use_sliding_window": True, "rope_scaling": {"type": "linear"}},
}
MAX_PARAMETERS = 6_000_000  # a default that makes the model bigger than this is checked as a config only
CASES = [(family, key) for family, defaults in DEFAULTS.items() for key in defaults]


def _reference(family: str) -> dict:
    return json.loads((BLOCK_REFERENCE_DIR / family / "config.json").read_text())


def _first_case(family: str) -> tuple[list[int], int]:
    case = json.loads((BLOCK_REFERENCE_DIR / family / "forward.json").read_text())["cases"][0]
    return case["input_ids"], case["block_length"]


def _logits(directory: Path, family: str) -> torch.Tensor:
    ids, block_length = _first_case(family)
    return block_causal_logits(load_model(str(directory)).model, ids, block_length)


def _with_config(tmp_path: Path, name: str, weights: Path, raw: dict) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(weights / "model.safetensors", directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(raw))
    return directory


def _parameters(raw: dict) -> int:
    model = build_model(config_from_dict(raw), torch.device("meta"), torch.float32)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("family", "key"), CASES)
def test_a_dropped_field_reads_as_the_reference_default(tmp_path, family, key):
    raw = _reference(family)
    without = {k: v for k, v in raw.items() if k != key}
    explicit = {**raw, key: DEFAULTS[family][key]}
    try:
        expected = config_from_dict(explicit)
    except ModelConfigError as refused:  # a default this checkpoint's shape cannot take: refused alike
        with pytest.raises(ModelConfigError, match=str(refused).split(" ")[0]):
            config_from_dict(without)
        return
    assert config_from_dict(without) == expected
    if raw.get(key) == DEFAULTS[family][key] or key not in raw:
        reference = load_file(str(BLOCK_REFERENCE_DIR / family / "logits.safetensors"))["forward_0"]
        loaded = _logits(_with_config(tmp_path, "without", BLOCK_REFERENCE_DIR / family, without), family)
        assert torch.allclose(loaded, reference, atol=1e-3)
    elif _parameters(explicit) <= MAX_PARAMETERS:
        weights = write_checkpoint(tmp_path / "explicit", explicit, seed=3)
        written = _logits(weights, family)
        assert torch.equal(_logits(_with_config(tmp_path, "without", weights, without), family), written)


def test_llada2_without_use_qk_norm_applies_the_qk_norms():
    """The reference class defaults use_qk_norm to true: the reference checkpoint (made with q/k norms)
    loads from a config.json without the field and gives the reference logits."""
    raw = {k: v for k, v in _reference("llada2").items() if k != "use_qk_norm"}
    config = config_from_dict(raw)
    assert config.qk_norm
    model = build_model(config, torch.device("meta"), torch.float32)
    assert hasattr(model.layers[0].attention, "query_layernorm")


@pytest.mark.parametrize(("family", "key"), [(f, k) for f, fixed in FIXED.items() for k in fixed])
def test_a_field_the_engine_does_not_implement_is_refused_by_name(family, key):
    with pytest.raises(ModelConfigError, match=key):
        config_from_dict({**_reference(family), key: FIXED[family][key]})


@pytest.mark.parametrize("family", sorted(DEFAULTS))
def test_a_size_the_layers_need_is_refused_by_name_when_absent(family):
    raw = _reference(family)
    if family == "llada2":
        for key in ("moe_intermediate_size", "intermediate_size"):
            with pytest.raises(ModelConfigError, match=key):
                config_from_dict({k: v for k, v in raw.items() if k != key})
    else:
        assert (
            config_from_dict({k: v for k, v in raw.items() if k != "intermediate_size"}).intermediate_size
            == 22016
        )
