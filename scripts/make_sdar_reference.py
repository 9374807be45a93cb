"""SDAR's reference vectors (see make_block_reference.py, which runs this with ``--family sdar``).

The reference folder holds ``modeling_sdar.py``, ``configuration_sdar.py``, ``sdar_utils.py`` (the
mirror's context module, imported by the modelling file as ``opencompass.models.sdar_utils``) and
``generate.py`` (JetAstra/SDAR's ``block_diffusion_generate``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from block_reference.shared import EOS_ID, MASK_ID, ORDINARY, forward_cases, write_checkpoint
from safetensors.torch import save_file

SDAR_CONFIG = {
    "architectures": ["SDARForCausalLM"],
    "model_type": "sdar",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "use_sliding_window": False,
    "tie_word_embeddings": False,  # as SDAR-8B (the smaller ones tie)
    "attention_dropout": 0.0,
    "fuse_cross_entropy": False,  # a training option the modelling file reads at every forward
    "bos_token_id": EOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": EOS_ID,
    "mask_token_id": MASK_ID,
    "torch_dtype": "float32",
}
PROMPT_LENGTHS = (4, 8, 13)
# (block length, denoising steps, gen length, strategy, threshold). One quota per step (steps = block
# length) for the dynamic rule: with a larger quota, torch.topk in the reference may pick positions that
# are no longer masked once fewer masks than the quota are left, and overwrite committed tokens.
GENERATE_GRID = [
    (4, 4, 16, "low_confidence_dynamic", 0.9),
    (4, 4, 16, "low_confidence_dynamic", 0.3),
    (8, 8, 24, "low_confidence_dynamic", 0.5),
    (8, 8, 24, "low_confidence_dynamic", 1.0),
    (16, 16, 32, "low_confidence_dynamic", 0.6),
    # shorter than a block and than the steps (SDAR's generate keeps every step: it has no cap)
    (8, 8, 5, "low_confidence_dynamic", 0.5),
    (4, 4, 3, "low_confidence_dynamic", 0.9),
    (8, 8, 2, "low_confidence_dynamic", 1.0),
]


def _load(name: str, path: Path, package: str | None = None):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if package is not None:
        module.__package__ = package
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def import_sdar(directory: Path):
    """The modelling and generation modules, with the imports the mirror's modelling file expects."""
    for name in ("opencompass", "opencompass.models"):
        sys.modules.setdefault(name, types.ModuleType(name))
    _load("opencompass.models.sdar_utils", directory / "sdar_utils.py")
    package = types.ModuleType("sdar_reference")
    package.__path__ = [str(directory)]
    sys.modules["sdar_reference"] = package
    _load("sdar_reference.configuration_sdar", directory / "configuration_sdar.py", "sdar_reference")
    modeling = _load("sdar_reference.modeling_sdar", directory / "modeling_sdar.py", "sdar_reference")
    generate = _load("sdar_generate", directory / "generate.py")
    return modeling, sys.modules["sdar_reference.configuration_sdar"], generate


def greedy(logits: torch.Tensor, temperature=1.0, top_k=0, top_p=1.0):
    """The argmax and its softmax probability, in the shapes ``sample_with_temperature_topk_topp`` returns."""
    probs = F.softmax(logits, dim=-1)
    token = probs.argmax(dim=-1)
    return token, probs.gather(-1, token[..., None])[..., 0]


class Calls:
    """Counts the model's forwards, those that only store the block's keys and values apart."""

    def __init__(self, model) -> None:
        self.denoise = self.store = 0
        model.model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _module, _args, kwargs):
        if kwargs.get("store_kv"):
            self.store += 1
        else:
            self.denoise += 1


def _run(model, generate, calls: Calls, prompt: torch.Tensor, grid: tuple) -> dict:
    block, steps, gen, strategy, threshold = grid
    calls.denoise = calls.store = 0
    args = {
        "mask_id": MASK_ID,
        "gen_length": gen,
        "block_length": block,
        "denoising_steps": steps,
        "temperature": 1.0,
        "remasking_strategy": strategy,
        "confidence_threshold": threshold,
        "stopping_criteria_idx": [EOS_ID],
    }
    x = generate.block_diffusion_generate(model, {"input_ids": prompt[None]}, **args)[0]
    generated = x[prompt.shape[0] :].tolist()
    while generated and generated[-1] == MASK_ID:  # the blocks after a stop were never decoded
        generated.pop()
    return {
        "function": "block_diffusion_generate",
        "args": args,
        "sampling": "greedy: argmax and its softmax probability",
        "prompt_ids": prompt.tolist(),
        "output_ids": generated,
        "denoise_forwards": calls.denoise,
        "store_forwards": calls.store,
    }


def make_sdar(reference: Path, out: Path) -> tuple[int, int]:
    modeling, configuration, generate = import_sdar(reference)
    generate.sample_with_temperature_topk_topp = greedy
    config = configuration.SDARConfig(**SDAR_CONFIG)
    config._attn_implementation = "sdpa"
    model = write_checkpoint(
        modeling.SDARForCausalLM, config, SDAR_CONFIG, out, "model.embed_tokens.weight", "lm_head.weight"
    )
    generator = torch.Generator().manual_seed(7)
    cases, tensors = forward_cases(model, generator, boolean_mask=True)
    save_file(tensors, str(out / "logits.safetensors"))
    (out / "forward.json").write_text(json.dumps({"cases": cases}, indent=1) + "\n")
    calls, runs = Calls(model), []
    for length in PROMPT_LENGTHS:
        prompt = torch.randint(0, ORDINARY, (length,), generator=generator)
        runs += [_run(model, generate, calls, prompt, grid) for grid in GENERATE_GRID]
    (out / "generate.json").write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return len(cases), len(runs)


if __name__ == "__main__":  # a module of make_block_reference.py, which runs it
    print("usage: python scripts/make_block_reference.py --family sdar --reference DIR --out DIR")
    sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
