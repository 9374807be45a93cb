"""A request's sampling settings (no torch): temperature 0 is greedy decoding, the default."""

from __future__ import annotations

from dataclasses import dataclass


class SamplingError(ValueError):
    """Sampling settings out of range."""


@dataclass(frozen=True)
class SamplingParams:
    """How a request's proposals are drawn. The noise depends only on ``seed`` and where a token is
    drawn (its position, the step within its block, the vocabulary entry), never on the batch: a seeded
    request's output is the same alone or in any batch."""

    temperature: float = 0.0  # 0: greedy (argmax), the reference implementations' default
    top_p: float = 1.0  # nucleus: the smallest set of tokens whose probability reaches top_p
    top_k: int = 0  # 0: no limit
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (0.0 <= self.temperature <= 2.0, f"temperature must be in [0, 2], got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must not be negative, got {self.top_k}"),
            (0 <= self.seed < 2**63, f"seed must be in [0, 2**63), got {self.seed}"),
        ]
        for ok, message in checks:
            if not ok:
                raise SamplingError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_dict(cls, values: dict | None) -> SamplingParams | None:
        """Settings from a queue payload (None: None). A greedy request's are kept for its seed: a family
        whose canvases start from noise (DiffusionGemma) draws that noise with it."""
        return cls(**values) if values else None
