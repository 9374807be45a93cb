"""Per-row sampling settings of a batch as tensors on the device, the form the candidates' scoring and
the log probabilities read (decoding/candidates.py, decoding/logprobs.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.decoding.sampling_params import SamplingParams


@dataclass
class RowSampling:
    """Per-row sampling settings on the device (a greedy row has temperature 0 and is not drawn)."""

    sampled: torch.Tensor  # [R] bool
    temperature: torch.Tensor  # [R] scores' dtype (1 for greedy rows: never used)
    top_k: torch.Tensor  # [R] int64
    top_p: torch.Tensor  # [R] scores' dtype
    seeds: torch.Tensor  # [R] int64

    @classmethod
    def of(
        cls, params: list[SamplingParams | None], device: torch.device, dtype: torch.dtype
    ) -> RowSampling | None:
        """``params``: each row's sampling (None: greedy); None when every row is greedy."""
        if all(p is None or p.greedy for p in params):
            return None
        drawn = [p is not None and not p.greedy for p in params]
        return cls(
            sampled=torch.tensor(drawn, device=device),
            temperature=torch.tensor(
                [p.temperature if d else 1.0 for p, d in zip(params, drawn)], dtype=dtype, device=device
            ),
            top_k=torch.tensor([p.top_k if d else 0 for p, d in zip(params, drawn)], device=device),
            top_p=torch.tensor(
                [p.top_p if d else 1.0 for p, d in zip(params, drawn)], dtype=dtype, device=device
            ),
            seeds=torch.tensor(
                [p.seed if d else 0 for p, d in zip(params, drawn)], dtype=torch.int64, device=device
            ),
        )
