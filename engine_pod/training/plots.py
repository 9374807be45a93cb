"""The training loss curve as a PNG."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def plot_loss(history: list[tuple[int, float]], path: Path) -> None:
    if not history:
        return
    steps = [s for s, _ in history]
    losses = [v for _, v in history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, alpha=0.25, label="per step")
    ax.plot(steps, _smooth(losses, 100), label="moving average (100 steps)")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("masked-diffusion loss (1/t weighted)")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
