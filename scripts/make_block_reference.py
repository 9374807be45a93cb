"""Reference vectors for block-diffusion models, made by the published reference code.

Writes a tiny random checkpoint in the real Hugging Face layout of a family, then runs the reference
modelling and generation code on it: block-causal forward logits, and greedy generation runs for
several prompts, block lengths, step counts and thresholds. Only the vectors are committed, never
the reference code.

- ``--family llada2``: LLaDA2.0's Hugging Face modelling file (``modeling_llada2_moe.py`` and
  ``configuration_llada2_moe.py``, as published with the checkpoint and mirrored in ZHZisZZ/dllm under
  ``dllm/pipelines/llada2/models``) and its ``generate``.
- ``--family sdar``: SDAR's modelling file (``modeling_sdar.py``, ``configuration_sdar.py``, as
  mirrored with SDAR-8B-Chat-b32 in AnZhong24/FOCUS, whose additions stay off: ``sdar_utils.py``'s
  context has them disabled) and ``generate.py``'s ``block_diffusion_generate`` from JetAstra/SDAR.
  That generate has no greedy mode (it divides by the temperature and always draws); the script hands
  it a sampling function that returns the argmax and its softmax probability, the rest is theirs.

The reference code was written for transformers 4.x: run this script with ``transformers==4.57.1``:

    python -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install torch==2.13.0 transformers==4.57.1
    /tmp/refvenv/bin/python scripts/make_block_reference.py --family llada2 --reference DIR \
        --out tests/data/block_reference/llada2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
from pathlib import Path

import torch
from block_reference.shared import EOS_ID, MASK_ID, ORDINARY, forward_cases, write_checkpoint
from safetensors.torch import save_file

logger = logging.getLogger("make_block_reference")

CONFIG = {
    "architectures": ["LLaDA2MoeModelLM"],
    "model_type": "llada2_moe",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "use_qkv_bias": False,
    "use_qk_norm": True,
    "use_bias": False,
    "rms_norm_eps": 1e-06,
    "norm_head": False,
    "tie_word_embeddings": False,
    "embedding_dropout": 0.0,
    "attention_dropout": 0.0,
    "output_dropout": 0.0,
    "max_position_embeddings": 4096,
    "rope_theta": 600000,
    "rope_scaling": None,
    "partial_rotary_factor": 0.5,
    "pad_token_id": EOS_ID,
    "eos_token_id": EOS_ID,
    "mask_token_id": MASK_ID,
    "num_experts": 8,
    "num_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "moe_intermediate_size": 24,
    "first_k_dense_replace": 1,
    "score_function": "sigmoid",
    "norm_topk_prob": True,
    "moe_router_enable_expert_bias": True,
    "output_router_logits": False,
    "torch_dtype": "float32",
}
PROMPT_LENGTHS = (5, 8, 13)
GENERATE_GRID = [  # (block_length, steps, gen_length, threshold)
    (4, 4, 16, 0.95),
    (4, 2, 16, 0.5),
    (8, 8, 24, 0.95),
    (8, 4, 24, 0.3),
    (8, 8, 24, 1.0),  # nothing exceeds 1.0: the pure step schedule
    (16, 8, 32, 0.9),
    # shorter than a block and than the steps: the reference caps the steps at gen_length // minimal_topk
    (8, 8, 5, 0.95),
    (8, 8, 3, 1.0),
    (16, 8, 6, 0.9),
    (4, 4, 2, 0.5),
]


def import_reference(directory: Path):
    """The reference modelling module, imported as a package so that its relative imports resolve."""
    package = "llada2_reference"
    spec = importlib.util.spec_from_file_location(
        package, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module
    for name in ("configuration_llada2_moe", "modeling_llada2_moe"):
        sub = importlib.util.spec_from_file_location(f"{package}.{name}", directory / f"{name}.py")
        loaded = importlib.util.module_from_spec(sub)
        sys.modules[f"{package}.{name}"] = loaded
        sub.loader.exec_module(loaded)
    return sys.modules[f"{package}.modeling_llada2_moe"], sys.modules[f"{package}.configuration_llada2_moe"]


class ForwardTrace:
    """Counts the reference's forwards and records what each one's window was."""

    def __init__(self, model) -> None:
        self.calls: list[dict] = []
        # the inner model: ``generate`` calls the outer ``self.forward`` directly, which runs no hooks
        model.model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        self.calls.append({"input_len": int(ids.shape[1])})
        return args, _float_mask(kwargs)


def _float_mask(kwargs: dict) -> dict:
    """``generate`` builds its additive mask (0 or -inf) in bfloat16, for a bfloat16 model; SDPA refuses a
    mask whose dtype differs from a float32 model's queries. The same values in float32 (exact)."""
    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dtype == torch.bfloat16:
        kwargs = {**kwargs, "attention_mask": mask.float()}
    return kwargs


def _run(model, tracer: ForwardTrace, prompt: torch.Tensor, args: dict) -> dict:
    tracer.calls.clear()
    output = model.generate(inputs=prompt[None], **args)[0]
    return {
        "function": "LLaDA2MoeModelLM.generate",
        "args": args,
        "prompt_ids": prompt.tolist(),
        "output_ids": output.tolist(),
        "nfe": len(tracer.calls),
        "forward_input_lengths": [call["input_len"] for call in tracer.calls],
    }


def generate_runs(model, tracer: ForwardTrace, generator: torch.Generator) -> list[dict]:
    """The grid for every prompt, then one run per prompt whose EOS is a token the model does produce
    (the tiny vocabulary's own EOS never comes up), to exercise the stop after an EOS block."""
    runs = []
    for prompt_length in PROMPT_LENGTHS:
        prompt = torch.randint(0, ORDINARY, (prompt_length,), generator=generator)
        for block_length, steps, gen_length, threshold in GENERATE_GRID:
            args = {
                "temperature": 0.0,
                "block_length": block_length,
                "steps": steps,
                "gen_length": gen_length,
                "threshold": threshold,
                "minimal_topk": 1,
                "eos_early_stop": False,
                "eos_id": EOS_ID,
                "mask_id": MASK_ID,
            }
            runs.append(_run(model, tracer, prompt, args))
        produced = runs[-len(GENERATE_GRID)]["output_ids"]  # the first grid run of this prompt
        args = {**runs[-len(GENERATE_GRID)]["args"], "gen_length": 32, "eos_id": produced[6]}
        runs.append(_run(model, tracer, prompt, args))
    return runs


def make_llada2(reference: Path, out: Path) -> tuple[int, int]:
    modeling, configuration = import_reference(reference)
    config = configuration.LLaDA2MoeConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    model = write_checkpoint(
        modeling.LLaDA2MoeModelLM, config, CONFIG, out, "model.word_embeddings.weight", "lm_head.weight"
    )
    generator = torch.Generator().manual_seed(7)
    cases, tensors = forward_cases(model, generator)
    save_file(tensors, str(out / "logits.safetensors"))
    (out / "forward.json").write_text(json.dumps({"cases": cases}, indent=1) + "\n")
    runs = generate_runs(model, ForwardTrace(model), generator)
    (out / "generate.json").write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return len(cases), len(runs)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", choices=["llada2", "sdar"], default="llada2")
    parser.add_argument("--reference", type=Path, required=True, help="folder with the reference code files")
    parser.add_argument(
        "--out", type=Path, required=True, help="folder to write the checkpoint and vectors to"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.family == "sdar":
        from make_sdar_reference import make_sdar

        cases, runs = make_sdar(args.reference, args.out)
    else:
        cases, runs = make_llada2(args.reference, args.out)
    logger.info("wrote %d forward cases and %d generate runs to %s", cases, runs, args.out)


if __name__ == "__main__":
    main()
