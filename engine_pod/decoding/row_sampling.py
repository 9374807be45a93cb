"""Per-row sampling settings of a batch as tensors on the device, the form the candidates' scoring and
the log probabilities read (decoding/candidates.py), with what the host knows of them (whether a row
filters by top-k or top-p) kept on the host, so that no step reads them back. They travel to the device
inside the cycle's one copy: ``host_columns`` gives the runner five int64 columns to send with its own."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_contracts.request_params import RequestParams
from engine_pod.host_bundle import float64_bits

COLUMNS = 5  # sampled, temperature (float64 bits), top-k, top-p (float64 bits), seed
UNDRAWN = RequestParams(temperature=1.0)  # the columns of a greedy row (never drawn: never used)


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
    def host_columns(params: list[RequestParams]) -> list[list[int]] | None:
        """Per row, its ``COLUMNS`` settings as int64 (float64 bits for the floats); None when every row is
        greedy (then there is no RowSampling)."""
        if all(p.greedy for p in params):
            return None
        settings = [UNDRAWN if p.greedy else p for p in params]
        temperatures = float64_bits([p.temperature for p in settings])
        top_ps = float64_bits([p.top_p for p in settings])
        return [
            [int(not p.greedy), t, s.top_k, top_p, s.seed]
            for p, s, t, top_p in zip(params, settings, temperatures, top_ps)
        ]

    @classmethod
    def from_device(
        cls, columns: torch.Tensor, params: list[RequestParams], dtype: torch.dtype
    ) -> RowSampling:
        """``columns`` [R, COLUMNS]: ``host_columns`` on the device; ``params`` as the host knows them."""
        sampled, temperature, top_k, top_p, seeds = columns.unbind(1)
        return cls(
            sampled=sampled.bool(),
            temperature=temperature.contiguous().view(torch.float64).to(dtype),
            top_k=top_k,
            top_p=top_p.contiguous().view(torch.float64).to(dtype),
            seeds=seeds,
            filters=any(not p.greedy and (p.top_k > 0 or p.top_p < 1.0) for p in params),
        )
