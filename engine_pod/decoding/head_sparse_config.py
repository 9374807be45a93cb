"""The head-sparse cache's settings: one frozen class, its defaults and ranges (torch-free).

Off by default. ``uniform``: every head of every layer keeps ``retention`` of each row's context.
``head-centric``: per layer, heads ranked by importance (``dllm heads``) fall into three groups: the core
share kept whole, the regular heads at ``retention``, the minor share at ``minor_retention`` (never more
than ``retention``). The active block's own positions are always kept.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("off", "head-centric", "uniform")


class HeadSparseConfigError(ValueError):
    """Head-sparse settings out of range."""


@dataclass(frozen=True)
class HeadSparseConfig:
    mode: str = "off"  # off | head-centric | uniform
    retention: float = 0.5  # r: share of each row's context a (regular, or every uniform) head keeps
    core_share: float = 0.2  # head-centric: share of each layer's heads kept whole (the most important)
    minor_share: float = 0.2  # head-centric: share of each layer's heads sparsified hardest (the least)
    minor_retention: float = 0.2  # head-centric: the minor heads' retention (at most 0.2, and at most r)
    # cross-step consistency: a head whose scores over the positions it scored at the request's previous
    # refresh have a cosine similarity above this with the scores it ranked by then keeps that ranking
    # there (its selection stays put); 1 never holds (each refresh selects afresh)
    consistency: float = 0.9
    importance: str | None = None  # the JSON ``dllm heads`` wrote (head-centric needs it)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise HeadSparseConfigError(f"unknown sparse cache mode {self.mode!r}; choose one of {MODES}")
        if not 0.0 < self.retention <= 1.0:
            raise HeadSparseConfigError(f"retention must be in (0, 1], got {self.retention}")
        if not 0.0 < self.minor_retention <= 0.2:
            raise HeadSparseConfigError(f"minor retention must be in (0, 0.2], got {self.minor_retention}")
        for name in ("core_share", "minor_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise HeadSparseConfigError(
                    f"{name.replace('_', ' ')} must be in [0, 1], got {getattr(self, name)}"
                )
        if self.core_share + self.minor_share > 1.0:
            raise HeadSparseConfigError("core share and minor share together must be at most 1")
        if not -1.0 <= self.consistency <= 1.0:
            raise HeadSparseConfigError(f"consistency threshold must be in [-1, 1], got {self.consistency}")
        if self.mode == "head-centric" and not self.importance:
            raise HeadSparseConfigError(
                "head-centric retention needs head importance: pass the JSON `dllm heads` writes"
            )

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def group_retentions(self) -> tuple[float, float, float]:
        """(core, regular, minor) retention of head-centric groups."""
        return 1.0, self.retention, min(self.minor_retention, self.retention)
