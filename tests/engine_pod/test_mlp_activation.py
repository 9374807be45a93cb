"""The MLP's activation is configuration (``ModelConfig.activation``): each family reads it from its
config.json field (its reference's default when absent), an unknown name is refused naming that field, and
the gated MLP and LLaDA2.0's grouped experts compute the named function, checked against its formula."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from engine_pod.loading.config_readers import config_from_dict
from engine_pod.loading.presets import preset_config
from engine_pod.models.config import MLP_ACTIVATIONS, ModelConfigError
from engine_pod.models.layers import GatedMLP
from engine_pod.models.moe import MixtureOfExperts
from tests.factories import dream_config, llada2_config, llada_config, sdar_config

FIELDS = {  # family -> (a config.json of it, the field that names its MLP's activation)
    "llada": (llada_config, "activation_type"),
    "dream": (dream_config, "hidden_act"),
    "llada2": (llada2_config, "hidden_act"),
    "sdar": (sdar_config, "hidden_act"),
}
FORMULAS = {  # each activation written out, not taken from torch.nn.functional
    "silu": lambda x: x / (1 + torch.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "gelu_pytorch_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: x.clamp(min=0),
}


def test_every_activation_has_a_formula_here():
    assert set(FORMULAS) == set(MLP_ACTIVATIONS)


@pytest.mark.parametrize("family", sorted(FIELDS))
def test_each_family_reads_its_activation_field_and_defaults_to_silu(family):
    raw, field = FIELDS[family]
    config = raw()
    assert config_from_dict({**config, field: "gelu"}).activation == "gelu"
    assert config_from_dict({k: v for k, v in config.items() if k != field}).activation == "silu"


@pytest.mark.parametrize("family", sorted(FIELDS))
def test_an_unknown_activation_is_refused_naming_its_field(family):
    raw, field = FIELDS[family]
    with pytest.raises(ModelConfigError, match=f"{field}='swiglu'"):
        config_from_dict({**raw(), field: "swiglu"})


@pytest.mark.parametrize("name", sorted(MLP_ACTIVATIONS))
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_the_gated_mlp_computes_the_named_activation(name, grad):
    config = replace(config_from_dict(llada_config()), activation=name)
    torch.manual_seed(0)
    mlp = GatedMLP(config).double()
    x = torch.randn(3, 5, config.hidden_size, dtype=torch.float64)
    expected = mlp.down_proj(FORMULAS[name](mlp.gate_proj(x)) * mlp.up_proj(x))
    with torch.set_grad_enabled(grad):
        got = mlp(x)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_llada2_grouped_experts_apply_the_configs_activation():
    """The grouped matmuls (inference) and the loop over the experts hit agree under GELU, and GELU's
    experts answer otherwise than SiLU's with the same weights."""
    torch.set_num_threads(1)
    outputs = {}
    for name in ("gelu", "silu"):
        config = replace(preset_config("llada2-tiny"), activation=name)
        torch.manual_seed(0)
        moe = MixtureOfExperts(config).eval()
        with torch.no_grad():  # the router's weight is made empty (a loader fills it): give it values
            for parameter in moe.parameters():
                parameter.normal_(0, 0.05)
        moe.stack_experts()
        x = torch.randn(17, config.hidden_size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert moe._grouped_weights(x) is not None
            grouped = moe(x)
            moe._stacked = None  # the loop over the experts hit: each expert a GatedMLP
            looped = moe(x)
        assert torch.equal(grouped, looped)
        outputs[name] = grouped
    assert not torch.allclose(outputs["gelu"], outputs["silu"])
