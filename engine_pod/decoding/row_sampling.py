"""Per-row sampling settings of a batch as tensors on the device, the form the candidates' scoring and
the log probabilities read (decoding/candidates.py), with what the host knows of them (whether a row
filters by top-k or top-p) kept on the host, so that no step reads them back. They travel to the device
inside the cycle's one copy: ``host_columns`` gives the runner five int64 columns to send with its own."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.decoding.sampling_params import SamplingParams
from engine_pod.host_bundle import float64_bits

COLUMNS = 5  # sampled, temperature (float64 bits), top-k, top-p (float64 bits), seed


@dataclass
class RowSampling:
    """Per-row sampling settings on the device (a greedy row has temperature 0 and is not drawn)."""

    sampled: torch.Tensor  # [R] bool
    temperature: torch.Tensor  # [R] scores' dtype (1 for greedy rows: never used)
    top_k: torch.Tensor  # [R] int64
    top_p: torch.Tensor  # [R] scores' dtype
    seeds: torch.Tensor  # [R] int64
    filters: bool  # some sampled row keeps only its top-k or its top-p nucleus (known on the host)

    @staticmethod
    def host_columns(params: list[SamplingParams | None]) -> list[list[int]] | None:
        """Per row, its ``COLUMNS`` settings as int64 (float64 bits for the floats); None when every row is
        greedy (then there is no RowSampling)."""
        if all(p is None or p.greedy for p in params):
            return None
        chosen = [p if p is not None and not p.greedy else None for p in params]
        settings = [p or SamplingParams(temperature=1.0) for p in chosen]
        temperatures = float64_bits([p.temperature for p in settings])
        top_ps = float64_bits([p.top_p for p in settings])
        return [
            [int(c is not None), t, p.top_k, top_p, p.seed if c is not None else 0]
            for c, p, t, top_p in zip(chosen, settings, temperatures, top_ps)
        ]

    @classmethod
    def from_device(
        cls, columns: torch.Tensor, params: list[SamplingParams | None], dtype: torch.dtype
    ) -> RowSampling:
        """``columns`` [R, COLUMNS]: ``host_columns`` on the device; ``params`` as the host knows them."""
        sampled, temperature, top_k, top_p, seeds = columns.unbind(1)
        return cls(
            sampled=sampled.bool(),
            temperature=temperature.contiguous().view(torch.float64).to(dtype),
            top_k=top_k,
            top_p=top_p.contiguous().view(torch.float64).to(dtype),
            seeds=seeds,
            filters=any(p is not None and not p.greedy and (p.top_k > 0 or p.top_p < 1.0) for p in params),
        )
