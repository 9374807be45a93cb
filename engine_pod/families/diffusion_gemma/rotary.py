"""DiffusionGemma's rotary embeddings: one frequency table per layer type, applied rotate-half.

The sliding-window layers use ``default`` RoPE over the whole head; the full-attention layers Gemma 4's
``proportional`` RoPE: the first ``partial_rotary_factor`` of each half-head rotates, the rest keeps
frequency zero (cos 1, sin 0) but stays in the head. The tables are computed in float32 exactly as the
reference's (``1 / theta ** (i / d)`` in float32: the float64 table of ``models/layers.RotaryEmbedding``
rounds differently), and applied as ``x cos + rotate_half(x) sin`` over the full width, as the
reference does (``layers.apply_rotary``'s fused half-width form differs in the last bit).
"""

from __future__ import annotations

import torch

from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig, RopeSpec


def inverse_frequencies(spec: RopeSpec, head_dim: int) -> torch.Tensor:
    """The [head_dim / 2] float32 frequency table of one layer type (on the CPU, even while the model's
    modules are built on the meta device)."""
    if spec.rope_type == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float, device="cpu") / head_dim
        return 1.0 / (spec.theta**exponents)
    rotated = int(spec.partial_rotary_factor * head_dim // 2)
    exponents = torch.arange(0, 2 * rotated, 2, dtype=torch.int64, device="cpu").to(torch.float) / head_dim
    table = 1.0 / (spec.theta**exponents)
    if head_dim // 2 > rotated:
        table = torch.cat((table, torch.zeros(head_dim // 2 - rotated, dtype=torch.float, device="cpu")))
    return table / spec.factor


class GemmaRotary:
    """Per layer type: cos/sin at explicit positions. Plain tensors, not buffers, so that casting the
    model to bfloat16 does not round the frequencies."""

    def __init__(self, config: DiffusionGemmaConfig) -> None:
        self.tables: dict[str, torch.Tensor] = {}  # per layer type, on the CPU
        self._placed: dict[tuple[str, str], torch.Tensor] = {}  # copies on a device, made once
        for layer, kind in enumerate(config.layer_types):
            if kind not in self.tables:
                self.tables[kind] = inverse_frequencies(config.rope[kind], config.layer_head_dims[layer])

    def _on(self, kind: str, device: torch.device) -> torch.Tensor:
        """The table on ``device``, copied there once (not once per forward)."""
        key = (kind, str(device))
        if key not in self._placed:
            self._placed[key] = self.tables[kind].to(device)
        return self._placed[key]

    def cos_sin(
        self, positions: torch.Tensor, kind: str, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [R, T, head_dim] of ``positions`` [R, T], in ``dtype`` (computed in float32)."""
        table = self._on(kind, positions.device)
        freqs = positions[..., None].float() * table
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of x [R, T, heads, head_dim] by cos/sin [R, T, head_dim]."""
    cos, sin = cos[:, :, None], sin[:, :, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
