"""Random weights for a DiffusionGemma preset (``--model random:NAME``) under which its canvases settle.

The loader's generic draw (Normal(0, 0.02), unit norms) gives a decoder that is chaotic in its noisy
canvas: its argmax canvas changes at every step, so adaptive stopping never fires and every canvas takes
all its steps. These are the scales of the reference checkpoint (``tests/data/diffusion_gemma_reference``,
whose README describes them): norms, router scales and per-expert scales 1 + 0.2 N(0, 1); the embeddings
(also the LM head) 1 + 0.5 N(0, 1), a component shared by every token that keeps the decoder from being
chaotic; every other matrix N(0, 1) scaled by 2 (3 for queries, keys and the router) over the square root
of its fan-in. With the preset's sampler settings (``presets.GENERATION_CONFIGS``) its canvases settle
after a few steps to most of their limit, each at its own step.

Random weights seldom commit an EOS (whether one is likely depends on the draw, not on the scales), so
a request's answer runs to its length limit: a workload's lengths vary by its requests' ``max_tokens``.

Drawn on the model's device, in sorted name order from one generator seeded with ``seed``, in float32
and cast into each parameter: deterministic for a given seed and device type, and the same model in
every dtype (to its precision), since how a random model's canvases settle depends on the very draw (a
float64 draw of the same seed is another model, one that stops every canvas at its second step).
"""

from __future__ import annotations

import torch

from engine_pod.families.diffusion_gemma.model import DiffusionGemmaModel

NEAR_ONE = ("norm.weight", "router.scale", "per_expert_scale")  # 1 + 0.2 N(0, 1)
SHARP = ("q_proj.weight", "k_proj.weight", "router.proj.weight")  # 3 / sqrt(fan-in)
EMBEDDING_MEAN, EMBEDDING_STD = 1.0, 0.5  # shared by every token: 1; each token's own: 0.5 N(0, 1)


def _std(name: str, shape: torch.Size) -> float:
    fan_in = shape[-1] if len(shape) > 1 else 1
    return (3.0 if name.endswith(SHARP) else 2.0) / fan_in**0.5


def random_init(model: DiffusionGemmaModel, seed: int) -> None:
    """Draw every parameter of ``model`` in place (its constant buffers are ``fill_constants``')."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            draw = torch.empty(param.shape, dtype=torch.float32, device=device)
            if name.endswith(NEAR_ONE):
                draw.normal_(1.0, 0.2, generator=generator)
            elif name.endswith("embed_tokens.weight"):
                draw.normal_(EMBEDDING_MEAN, EMBEDDING_STD, generator=generator)
            else:
                draw.normal_(0.0, _std(name, param.shape), generator=generator)
            param.copy_(draw)
