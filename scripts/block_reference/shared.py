"""What the block-diffusion reference scripts share: the tiny vocabulary's ids, the seeded random
checkpoint (written in a family's layout and read back by its reference loader) and the block-causal
forward cases (make_block_reference.py for LLaDA2.0, make_sdar_reference.py for SDAR)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

MASK_ID, EOS_ID, ORDINARY = 500, 501, 480
MODEL_SEED = 2051
FORWARD_CASES = [(7, 4), (19, 8), (40, 8), (33, 16)]  # (sequence length, block length)


def _scale(name: str, shape: tuple[int, ...]) -> float:
    """Scales that make a random model's decisions well separated (as in the LLaDA/Dream vectors)."""
    fan_in = shape[-1] if len(shape) > 1 else 1
    if name == "lm_head.weight":
        return 5.0 / fan_in**0.5
    if name.endswith("query_key_value.weight") or name.endswith(("q_proj.weight", "k_proj.weight")):
        return 3.0 / fan_in**0.5
    if name.endswith("gate.weight"):
        return 4.0 / fan_in**0.5
    return 2.0 / fan_in**0.5


def random_state(
    shapes: dict[str, tuple[int, ...]], embedding: str, head: str | None
) -> dict[str, torch.Tensor]:
    """Every tensor drawn from one seeded generator, in sorted name order."""
    generator = torch.Generator().manual_seed(MODEL_SEED)
    state = {}
    for name in sorted(shapes):
        shape = shapes[name]
        draw = torch.randn(shape, generator=generator, dtype=torch.float32)
        if "norm" in name and name.endswith("weight"):
            state[name] = 1.0 + 0.1 * draw
        elif name.endswith("expert_bias"):
            state[name] = 0.1 * draw
        elif name == embedding:
            state[name] = draw
        else:
            state[name] = _scale(name, shape) * draw
    if head is not None:
        state[head][MASK_ID] = 0.0  # [MASK] is never the argmax
    state[embedding][MASK_ID] *= 0.3
    return state


def block_mask(length: int, block_length: int) -> torch.Tensor:  # additive (LLaDA2)
    """The reference's additive block-causal mask: 0 where a query's block may see a key's block."""
    blocks = (length + block_length - 1) // block_length
    allowed = torch.tril(torch.ones(blocks, blocks))
    allowed = allowed.repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)
    return allowed[:length, :length].log()[None, None]


def forward_cases(model, generator: torch.Generator, boolean_mask: bool = False):
    """Block-causal forwards over whole sequences: the mask additive (LLaDA2) or boolean (SDAR)."""
    cases, tensors = [], {}
    for index, (length, block_length) in enumerate(FORWARD_CASES):
        ids = torch.randint(0, ORDINARY, (length,), generator=generator)
        masked = torch.rand(length, generator=generator) < 0.3
        ids[masked] = MASK_ID
        mask = block_mask(length, block_length)
        mask = (mask == 0)[0] if boolean_mask else mask
        with torch.no_grad():
            logits = model(ids[None], attention_mask=mask, position_ids=torch.arange(length)[None]).logits[0]
        key = f"forward_{index}"
        tensors[key] = logits.contiguous()
        top2 = logits.topk(2, dim=-1).values
        cases.append(
            {
                "name": key,
                "input_ids": ids.tolist(),
                "block_length": block_length,
                "logits_key": key,
                "argmax": logits.argmax(-1).tolist(),
                "min_top1_top2_margin": float((top2[:, 0] - top2[:, 1]).min()),
            }
        )
    return cases, tensors


def write_checkpoint(model_class, config, raw: dict, out: Path, embedding: str, head: str | None):
    """A seeded random model saved under the checkpoint's names, read back by the reference loader."""
    model = model_class(config).eval().float()
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    state = random_state(shapes, embedding, head)
    model.load_state_dict(state, strict=True)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    reloaded = model_class.from_pretrained(str(out), config=config).eval().float()
    for name, tensor in reloaded.state_dict().items():
        if not torch.equal(tensor, state[name]):
            raise SystemExit(f"the reference loader read {name} differently from what was saved")
    return model
