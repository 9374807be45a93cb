"""Reference vectors for DiffusionGemma, made by the reference implementation in the pinned transformers.

Writes a tiny, seeded random DiffusionGemma checkpoint in the real Hugging Face layout (``config.json``
and ``model.safetensors`` exactly as ``DiffusionGemmaForBlockDiffusion.save_pretrained`` writes them,
vision tower included, as every DiffusionGemma checkpoint has one), then runs the reference code of
``transformers/models/diffusion_gemma`` (transformers 5.24.0, torch 2.13.0, CPU, float32, attention
``sdpa``, experts ``eager``) on it and saves what it produced as data:

- ``generate.json``: runs of ``DiffusionGemmaForBlockDiffusion.generate`` at batch 1, each after
  ``torch.manual_seed(seed)`` (the reference draws every random number from torch's global CPU
  generator: see the README for the exact draws), over canvas lengths, entropy bounds, step limits,
  temperature schedules, adaptive-stopping settings, prompt lengths on both sides of the sliding
  window, and runs that stop at an EOS in their second canvas.
- ``trace.json`` + ``trace_logits.safetensors``: one run's every decoder forward (its canvas input,
  positions, whether self-conditioning was given, the temperature of the step) and raw logits, so that
  the model forward can be checked apart from the sampler, and the sampler apart from the model.
- ``config_defaults.json``: the checkpoint's config.json with each optional field dropped in turn,
  and what the reference configuration class resolves it to (or the error it raises).

Only the vectors are committed, never reference code. Run it from the repository root:

    python scripts/make_diffusion_gemma_reference.py --out tests/data/diffusion_gemma_reference
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LogitsProcessorList
from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaConfig
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig
from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaForBlockDiffusion

logger = logging.getLogger("make_diffusion_gemma_reference")

MODEL_SEED = 4747
PROMPT_SEED = 11
EOS_ID, PAD_ID, BOS_ID = 1, 0, 2
TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,  # the full-attention layers' head width (saved as per_layer_config)
    "num_global_key_value_heads": 1,
    "sliding_window": 8,  # small, so that prompts and canvases cross it
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    "num_experts": 4,
    "top_k_experts": 2,
    "moe_intermediate_size": 32,
    "max_position_embeddings": 1024,
    # off the class defaults where the model reads them, so that dropping them is seen
    "rms_norm_eps": 1e-5,
    "final_logit_softcapping": 25.0,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 200000.0},
    },
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
    "bos_token_id": BOS_ID,
}
VISION_CONFIG: dict[str, Any] = {  # the smallest Gemma 4 vision tower: its weights must be skipped
    "model_type": "gemma4_vision",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 4,
    "patch_size": 2,
    "position_embedding_size": 16,
}
CANVAS_LENGTH = 16
PROMPT_LENGTHS = (3, 7, 13, 21)  # below and above the sliding window (8) and the canvas (16)
DEFAULTS = {  # DiffusionGemmaGenerationConfig._get_default_generation_params()
    "max_denoising_steps": 48,
    "entropy_bound": 0.1,
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
}
# (canvas_length, max_new_tokens, overrides of DEFAULTS)
GRID: list[tuple[int, int, dict[str, Any]]] = [
    (16, 40, {"max_denoising_steps": 8}),
    (16, 20, {"max_denoising_steps": 6, "entropy_bound": 0.5}),
    (16, 30, {"max_denoising_steps": 12, "entropy_bound": 2.0, "confidence_threshold": 1.0}),
    (16, 10, {"max_denoising_steps": 4, "entropy_bound": 1.0, "t_min": 0.2, "t_max": 1.5}),
    (
        32,
        40,
        {
            "max_denoising_steps": 10,
            "entropy_bound": 0.5,
            "stability_threshold": 2,
            "confidence_threshold": 1.0,
        },
    ),
    (
        32,
        32,
        {
            "max_denoising_steps": 16,
            "entropy_bound": 3.0,
            "stability_threshold": 0,
            "confidence_threshold": 1.5,
        },
    ),
    (16, 32, {}),  # the reference's defaults (48 steps)
    # everything accepted at a low temperature: the canvas settles, stable and confident stop it early
    (
        16,
        40,
        {
            "max_denoising_steps": 16,
            "entropy_bound": 1000.0,
            "t_min": 0.05,
            "t_max": 0.1,
            "confidence_threshold": 1.0,
        },
    ),
    (
        32,
        40,
        {
            "max_denoising_steps": 12,
            "entropy_bound": 1000.0,
            "t_min": 0.1,
            "t_max": 0.3,
            "stability_threshold": 2,
            "confidence_threshold": 2.0,
        },
    ),
]
TRACE = (16, 32, {"max_denoising_steps": 3, "entropy_bound": 0.5})  # 2 canvases x 3 steps of logits


def _scale(name: str, shape: tuple[int, ...]) -> float:
    """Scales that give the random model well separated, varied predictions."""
    fan_in = shape[-1] if len(shape) > 1 else 1
    if name.endswith(("q_proj.weight", "k_proj.weight", "router.proj.weight")):
        return 3.0 / fan_in**0.5
    return 2.0 / fan_in**0.5


def random_state(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Every saved tensor drawn from one seeded generator, in sorted name order."""
    generator = torch.Generator().manual_seed(MODEL_SEED)
    state = {}
    for name in sorted(shapes):
        shape = shapes[name]
        draw = torch.randn(shape, generator=generator, dtype=torch.float32)
        if name.endswith(("norm.weight", "router.scale", "per_expert_scale", "layer_scalar")):
            state[name] = 1.0 + 0.2 * draw
        elif name.endswith("position_embedding_table"):
            state[name] = draw
        elif name.endswith("embed_tokens.weight"):
            # also the LM head. A shared component makes the decoder less sensitive to the noise in
            # its canvas (random weights are otherwise chaotic: the canvas never settles)
            state[name] = 1.0 + 0.5 * draw
        else:
            state[name] = _scale(name, shape) * draw
    return state


def build_reference(out: Path) -> DiffusionGemmaForBlockDiffusion:
    """The seeded checkpoint written in the save_pretrained layout, read back by from_pretrained."""
    config = DiffusionGemmaConfig(
        text_config=dict(TEXT_CONFIG), vision_config=dict(VISION_CONFIG), canvas_length=CANVAS_LENGTH
    )
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        DiffusionGemmaForBlockDiffusion(config).save_pretrained(scratch)
        with safe_open(str(Path(scratch) / "model.safetensors"), framework="pt") as handle:
            shapes = {key: tuple(handle.get_tensor(key).shape) for key in handle.keys()}  # noqa: SIM118
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text((Path(scratch) / "config.json").read_text())
    state = random_state(shapes)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(
        str(out), attn_implementation="sdpa", experts_implementation="eager", dtype=torch.float32
    ).eval()
    # from_pretrained leaves the tensors in the file's memory map, at offsets that are not 64-byte aligned;
    # small CPU matmuls (a one-token expert) round differently there. Fresh, aligned copies: the same
    # values, the rounding that any freshly allocated model (ours included) gets.
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()
    loaded = model.state_dict()
    for name, tensor in state.items():
        if not torch.equal(loaded[name], tensor):
            raise SystemExit(f"the reference loader read {name} differently from what was saved")
    encoder, decoder = model.model.encoder.language_model, model.model.decoder
    if encoder.layers[0].experts.gate_up_proj is not decoder.layers[0].experts.gate_up_proj:
        raise SystemExit("the reference did not tie the encoder's layers to the decoder's")
    return model


def _generation_args(canvas_length: int, max_new_tokens: int, overrides: dict, eos: int) -> dict:
    values = {**DEFAULTS, **overrides}
    return {
        "canvas_length": canvas_length,
        "max_new_tokens": max_new_tokens,
        **values,
        "eos_token_id": eos,
        "pad_token_id": PAD_ID,
    }


class DecoderCounter:
    """Counts the decoder forwards between encoder forwards: the denoising steps of each canvas."""

    def __init__(self, model: DiffusionGemmaForBlockDiffusion) -> None:
        self.steps: list[int] = []
        model.model.encoder.register_forward_pre_hook(lambda *_: self.steps.append(0))
        model.model.decoder.register_forward_pre_hook(lambda *_: self._step())

    def _step(self) -> None:
        self.steps[-1] += 1


def run_generate(
    model, counter: DecoderCounter, prompt: list[int], args: dict, seed: int, processors: list | None = None
) -> dict:
    """One seeded reference generate at batch 1."""
    model.config.canvas_length = args["canvas_length"]
    counter.steps.clear()
    torch.manual_seed(seed)
    output = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=args["max_new_tokens"],
        max_denoising_steps=args["max_denoising_steps"],
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(args["entropy_bound"])),
        t_min=args["t_min"],
        t_max=args["t_max"],
        stability_threshold=args["stability_threshold"],
        confidence_threshold=float(args["confidence_threshold"]),
        eos_token_id=args["eos_token_id"],
        pad_token_id=args["pad_token_id"],
        logits_processor=LogitsProcessorList(processors or []),
    )
    sequence = output.sequences[0].tolist()
    return {
        "function": "DiffusionGemmaForBlockDiffusion.generate",
        "seed": seed,
        "args": args,
        "prompt_ids": prompt,
        "output_ids": sequence[len(prompt) :],
        "steps_per_canvas": list(counter.steps),
        "tokens_per_forward": float(output.tokens_per_forward[0]),
    }


def _eos_in_second_canvas(run: dict) -> int | None:
    """A token of the run's second canvas that its first canvas lacks (None if there is none)."""
    length = run["args"]["canvas_length"]
    first, second = run["output_ids"][:length], run["output_ids"][length : 2 * length]
    candidates = [t for t in second[2:] if t not in first and t not in (PAD_ID, EOS_ID)]
    return candidates[0] if candidates else None


def generate_runs(model: DiffusionGemmaForBlockDiffusion) -> list[dict]:
    counter = DecoderCounter(model)
    generator = torch.Generator().manual_seed(PROMPT_SEED)
    runs = []
    seed = 100
    for prompt_length in PROMPT_LENGTHS:
        prompt = torch.randint(3, TEXT_CONFIG["vocab_size"], (prompt_length,), generator=generator).tolist()
        for canvas_length, max_new_tokens, overrides in GRID:
            seed += 1
            args = _generation_args(canvas_length, max_new_tokens, overrides, EOS_ID)
            run = run_generate(model, counter, prompt, args, seed)
            runs.append(run)
            eos = _eos_in_second_canvas(run) if len(run["steps_per_canvas"]) >= 3 else None
            if eos is not None and canvas_length == 16 and overrides == GRID[0][2]:
                stop = run_generate(model, counter, prompt, {**args, "eos_token_id": eos}, seed)
                stop["note"] = "EOS chosen from the second canvas of the run before: the stop in canvas 2"
                runs.append(stop)
    return runs


class StepRecorder:
    """A logits processor (run before the temperature schedule) recording each step's ``cur_step``."""

    def __init__(self) -> None:
        self.remaining: list[int] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, cur_step: torch.Tensor) -> torch.Tensor:
        self.remaining.append(int(cur_step))
        return scores


def trace_run(model: DiffusionGemmaForBlockDiffusion, out: Path) -> None:
    """Every decoder forward of one run: inputs and raw logits, and the step's temperature."""
    canvas_length, max_new_tokens, overrides = TRACE
    args = _generation_args(canvas_length, max_new_tokens, overrides, EOS_ID)
    prompt = list(range(40, 51))
    steps, logits = [], {}
    original = model.forward

    def recording_forward(*f_args, **kwargs):
        result = original(*f_args, **kwargs)
        index = len(steps)
        steps.append(
            {
                "canvas_input": kwargs["decoder_input_ids"][0].tolist(),
                "positions": kwargs["decoder_position_ids"][0].tolist(),
                "self_conditioning": kwargs["self_conditioning_logits"] is not None,
                "logits_key": f"step_{index}",
            }
        )
        logits[f"step_{index}"] = result.logits[0].contiguous().clone()
        return result

    recorder = StepRecorder()

    model.forward = recording_forward
    try:
        run = run_generate(model, DecoderCounter(model), prompt, args, 2026, [recorder])
    finally:
        del model.forward
    for step, cur_step in zip(steps, recorder.remaining, strict=True):
        temperature = args["t_min"] + (args["t_max"] - args["t_min"]) * (
            torch.tensor(cur_step, dtype=torch.int32) / args["max_denoising_steps"]
        )
        step["steps_remaining"] = cur_step
        step["temperature"] = float(temperature)
    save_file(logits, str(out / "trace_logits.safetensors"))
    (out / "trace.json").write_text(json.dumps({"run": run, "steps": steps}, indent=1) + "\n")


def _resolved(config: DiffusionGemmaConfig) -> dict[str, Any]:
    """What the reference configuration class makes of a config.json: the fields the model reads."""
    text = config.text_config
    names = [
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "hidden_activation", "max_position_embeddings", "rms_norm_eps",
        "pad_token_id", "eos_token_id", "bos_token_id", "rope_parameters", "attention_bias", "sliding_window",
        "layer_types", "final_logit_softcapping", "use_bidirectional_attention", "num_experts",
        "top_k_experts", "moe_intermediate_size",
    ]  # fmt: skip
    resolved = {f"text.{name}": getattr(text, name) for name in names}
    resolved["text.layer_head_dims"] = [
        text.per_layer_config[i].head_dim for i in range(text.num_hidden_layers)
    ]
    resolved["text.layer_kv_heads"] = [
        text.per_layer_config[i].num_key_value_heads for i in range(text.num_hidden_layers)
    ]
    for name in ("canvas_length", "tie_word_embeddings", "image_token_id", "boi_token_id", "eoi_token_id"):
        resolved[name] = getattr(config, name)
    return json.loads(json.dumps(resolved))


def config_defaults(out: Path) -> None:
    """The checkpoint's config.json with each optional field dropped in turn, as the reference resolves it."""
    raw = json.loads((out / "config.json").read_text())
    bookkeeping = {"architectures", "model_type", "transformers_version", "dtype"}
    cases = [{"drop": None, "resolved": _resolved(DiffusionGemmaConfig(**raw))}]
    for key in sorted(set(raw) - bookkeeping):
        cases.append(_drop_case(raw, [key]))
    for key in sorted(set(raw["text_config"]) - bookkeeping):
        cases.append(_drop_case(raw, ["text_config", key]))
    # the other spelling of the full-attention layers' heads (Gemma 4's config.json fields)
    cases.append(
        _drop_case(
            raw, ["text_config", "per_layer_config"], {"global_head_dim": 32, "num_global_key_value_heads": 1}
        )
    )
    (out / "config_defaults.json").write_text(json.dumps({"cases": cases}, indent=1) + "\n")


def _drop_case(raw: dict, path: list[str], add: dict | None = None) -> dict:
    """``raw`` less the field at ``path`` (plus ``add`` beside it), as the reference resolves it."""
    dropped = json.loads(json.dumps(raw))
    parent = dropped
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    parent.update(add or {})
    case: dict[str, Any] = {"drop": path, **({"add": add} if add else {})}
    try:
        return {**case, "resolved": _resolved(DiffusionGemmaConfig(**dropped))}
    except Exception as exc:  # the reference refuses it: so must we
        return {**case, "error": f"{type(exc).__name__}: {exc}"[:300]}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder to write the checkpoint and vectors to"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # the reference's CPU results do not depend on it; one thread is reproducible
    model = build_reference(args.out)
    config_defaults(args.out)
    trace_run(model, args.out)
    runs = generate_runs(model)
    (args.out / "generate.json").write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    logger.info("wrote %d generate runs, a trace and the config defaults to %s", len(runs), args.out)


if __name__ == "__main__":
    main()
