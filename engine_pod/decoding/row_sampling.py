"""Per-row sampling settings of a batch as tensors on the device, the form the candidates' scoring and
the log probabilities read (decoding/candidates.py), sent in one copy, with what the host knows of them
(whether a row filters by top-k or top-p) kept on the host, so that no step reads them back."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.decoding.sampling_params import SamplingParams
from engine_pod.host_bundle import float64_bits, send


@dataclass
class RowSampling:
    """Per-row sampling settings on the device (a greedy row has temperature 0 and is not drawn)."""

    sampled: torch.Tensor  # [R] bool
    temperature: torch.Tensor  # [R] scores' dtype (1 for greedy rows: never used)
    top_k: torch.Tensor  # [R] int64
    top_p: torch.Tensor  # [R] scores' dtype
    seeds: torch.Tensor  # [R] int64
    filters: bool  # some sampled row keeps only its top-k or its top-p nucleus (known on the host)

    @classmethod
    def of(
        cls, params: list[SamplingParams | None], device: torch.device, dtype: torch.dtype
    ) -> RowSampling | None:
        """``params``: each row's sampling (None: greedy); None when every row is greedy. One copy."""
        if all(p is None or p.greedy for p in params):
            return None
        drawn = [p is not None and not p.greedy for p in params]
        chosen = [p if d else SamplingParams(temperature=1.0) for p, d in zip(params, drawn)]
        sampled, temperature, top_k, top_p, seeds = send(
            [
                [int(d) for d in drawn],
                float64_bits([p.temperature for p in chosen]),
                [p.top_k for p in chosen],
                float64_bits([p.top_p for p in chosen]),
                [p.seed if d else 0 for p, d in zip(chosen, drawn)],
            ],
            device,
        )
        return cls(
            sampled=sampled.bool(),
            temperature=temperature.view(torch.float64).to(dtype),
            top_k=top_k,
            top_p=top_p.view(torch.float64).to(dtype),
            seeds=seeds,
            filters=any(p.top_k > 0 or p.top_p < 1.0 for p, d in zip(chosen, drawn) if d),
        )
