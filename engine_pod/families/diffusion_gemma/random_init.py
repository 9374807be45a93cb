"""How a DiffusionGemma preset's random weights (``--model random:NAME``) are drawn, so that its canvases
settle.

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

The draw itself is the loader's (``models/random_weights.py``: tiles from generators of their own, in
float32, cast into each parameter), so every rank of a group draws only its part of the same model; the
layer scalars, which are buffers, are ones (``fill_constants``).
"""

from __future__ import annotations

from engine_pod.models.random_weights import Law

NEAR_ONE = ("norm.weight", "router.scale", "per_expert_scale")  # 1 + 0.2 N(0, 1)
SHARP = ("q_proj.weight", "k_proj.weight", "router.proj.weight")  # 3 / sqrt(fan-in)
EMBEDDING_MEAN, EMBEDDING_STD = 1.0, 0.5  # shared by every token: 1; each token's own: 0.5 N(0, 1)


def random_law(name: str, shape: tuple[int, ...]) -> Law:
    """The distribution parameter ``name`` of the whole model's ``shape`` is drawn from."""
    if name.endswith(NEAR_ONE):
        return Law(1.0, 0.2)
    if name.endswith("embed_tokens.weight"):
        return Law(EMBEDDING_MEAN, EMBEDDING_STD)
    fan_in = shape[-1] if len(shape) > 1 else 1
    return Law(0.0, (3.0 if name.endswith(SHARP) else 2.0) / fan_in**0.5)
