"""Benchmark plots: throughput per policy, latency CDF, and the block-cycle timeline (rows, box width)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_benchmark(report: dict, path: Path) -> None:
    policies = report["policies"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    _throughput(axes[0][0], policies)
    _latency_cdf(axes[0][1], report["latencies"])
    _timeline(axes[1][0], axes[1][1], report["timelines"])
    model = Path(report["model"]).name or report["model"]
    fig.suptitle(f"{report['workload']['name']} on {model} ({report['device']}, {report['dtype']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput(ax, policies: dict) -> None:
    names = list(policies)
    values = [policies[n]["tokens_per_s"] for n in names]
    bars = ax.bar(names, values, color=["#999999", "#d62728", "#1f77b4", "#2ca02c", "#9467bd"][: len(names)])
    for bar, name in zip(bars, names):
        ratio = policies[name].get("speedup_vs_static")
        label = f"{bar.get_height():.0f}" + (f"\n{ratio:.2f}x static" if ratio else "")
        ax.annotate(
            label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8
        )
    ax.set_ylabel("generated tokens / s")
    ax.set_title("throughput")
    ax.tick_params(axis="x", labelrotation=12)


def _latency_cdf(ax, latencies: dict) -> None:
    for name, values in latencies.items():
        ordered = sorted(values)
        ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
    ax.set_xlabel("request latency (s, all requests arrive at t=0)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("latency CDF")
    ax.legend()
    ax.grid(alpha=0.3)


def _timeline(rows_ax, width_ax, timelines: dict) -> None:
    for name, cycles in timelines.items():
        starts = [c["started_s"] for c in cycles]
        rows_ax.step(starts, [c["rows"] for c in cycles], where="post", label=name)
        width_ax.step(starts, [c["box_width"] for c in cycles], where="post", label=name)
    rows_ax.set_title("active rows per block cycle")
    rows_ax.set_xlabel("time (s)")
    rows_ax.set_ylabel("|A|")
    width_ax.set_title("bounding-box width per block cycle")
    width_ax.set_xlabel("time (s)")
    width_ax.set_ylabel("max_i p_i + (b_i + 1) L")
    for ax in (rows_ax, width_ax):
        ax.legend()
        ax.grid(alpha=0.3)


def plot_online(report: dict, path: Path) -> None:
    """Latency (p50 and p99, end to end) and time to the first block against the offered load."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, by_load in report["runs"].items():
        loads = [load for load in report["loads"] if load["label"] in by_load]
        x = [load["rate"] if load["rate"] is not None else load["concurrency"] for load in loads]
        runs = [by_load[load["label"]] for load in loads]
        (line,) = axes[0].plot(x, [r["latency_s"]["p50"] for r in runs], marker="o", label=f"{name} p50")
        axes[0].plot(
            x,
            [r["latency_s"]["p99"] for r in runs],
            marker="x",
            ls="--",
            color=line.get_color(),
            label=f"{name} p99",
        )
        axes[1].plot(
            x,
            [r["first_block_s"].get("p50", 0) for r in runs],
            marker="o",
            color=line.get_color(),
            label=name,
        )
    closed = report["loads"] and report["loads"][0]["rate"] is None
    for ax, title in zip(axes, ("end-to-end latency (s)", "time to the first committed block, p50 (s)")):
        ax.set_xlabel("clients (closed loop)" if closed else "offered load (requests/s)")
        ax.set_title(title)
        ax.set_yscale("log")  # static's queueing and a second-scale tail on one axis
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"{report['workload']}: {report['requests']} requests per load ({report['target']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
