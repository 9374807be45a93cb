"""Least-squares fit of peak memory against batch tokens: peak = weights + a + b x tokens."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryFit:
    weights_bytes: int
    intercept_bytes: float  # a: runtime overhead beyond the weights
    bytes_per_token: float  # b
    r_squared: float
    max_relative_error: float  # over the points used in the fit

    def predict(self, tokens: int) -> float:
        return self.weights_bytes + self.intercept_bytes + self.bytes_per_token * tokens

    def budget(self, usable_bytes: float) -> int:
        """Largest token count whose predicted peak fits ``usable_bytes``."""
        return int((usable_bytes - self.weights_bytes - self.intercept_bytes) // self.bytes_per_token)


class FitError(ValueError):
    """The measurements do not support a memory model."""


def fit_peak(tokens: list[int], peaks: list[int], weights_bytes: int) -> MemoryFit:
    if len(tokens) < 2 or len(set(tokens)) < 2:
        raise FitError("need measurements at two or more different token counts to fit peak memory")
    ys = [p - weights_bytes for p in peaks]
    n = len(tokens)
    mean_x, mean_y = sum(tokens) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in tokens)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(tokens, ys))
    slope = sxy / sxx
    if slope <= 0:
        raise FitError(
            f"peak memory does not grow with batch tokens (slope {slope:.1f} bytes/token): grid too small"
        )
    intercept = mean_y - slope * mean_x
    residual = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(tokens, ys))
    total = sum((y - mean_y) ** 2 for y in ys)
    fit = MemoryFit(weights_bytes, intercept, slope, 1 - residual / total if total else 1.0, 0.0)
    worst = max(abs(fit.predict(x) - p) / p for x, p in zip(tokens, peaks))
    return MemoryFit(weights_bytes, intercept, slope, fit.r_squared, worst)
