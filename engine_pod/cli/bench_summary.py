"""The summary `dllm bench` prints: the setup, then one line per policy."""

from __future__ import annotations


def summary_text(report: dict) -> str:
    """Everything needed to judge a run: the setup, then one line per policy."""
    usable = report.get("usable_memory_bytes")
    lines = [
        f"device {report['device_name']} ({report['device']}, {report['dtype']}), torch {report['torch_version']}",
        f"token budget {report['token_budget']}, static batch size {report['static_batch_size']}, "
        f"usable memory {f'{usable / 2**20:.0f} MiB' if usable else 'unknown (no --profile)'}",
        _decoding_line(report),
        _threads_line(report),
        f"{'policy':<22}{'wall s':>8}{'tokens':>9}{'forwards':>9}{'tok/s':>10}{'speedup':>9}"
        f"{'pad eff':>9}{'peak MiB':>10}{'peak/usable':>12}{'agreement':>10}",
    ]
    agreement = report["output_comparison"]["per_policy"]
    for name, m in report["policies"].items():
        speedup = m.get("speedup_vs_static")
        peak = m["peak_memory_bytes"]
        share = f"{peak / usable:.3f}" if usable else "-"
        agrees = agreement.get(name, {}).get("token_agreement", 1.0)
        lines.append(
            f"{name:<22}{m['wall_s']:>8.1f}{m['generated_tokens']:>9}{m['num_forward_passes']:>9}"
            f"{m['tokens_per_s']:>10.1f}{(f'{speedup:.2f}x' if speedup else '-'):>9}"
            f"{m['padding_efficiency']:>9.3f}{peak / 2**20:>10.0f}{share:>12}{agrees:>10.4f}"
        )
    lines.append(
        f"token agreement is against {report['output_comparison']['reference_policy']}; "
        f"outputs identical across policies: {report['outputs_identical']}"
    )
    return "\n".join(lines)


def _threads_line(report: dict) -> str:
    threads = report.get("torch_threads")
    return f"torch threads {threads['threads']} ({threads['reason']})" if threads else "torch threads unknown"


def _decoding_line(report: dict) -> str:
    """The confidence threshold, or the settings the model's family adds (DiffusionGemma's sampler's) for
    a family that adds some; and whether the products were batch-invariant (--batch-invariant)."""
    invariant = {
        ("on",): "; batch-invariant products, every batch packed",
        ("on", "off"): "; every policy with batch-invariant products (every batch packed) and without",
        ("off", "on"): "; every policy without batch-invariant products and with (every batch packed)",
    }.get(tuple(report.get("batch_invariant", ())), "")
    if family_settings := report.get("family_settings"):
        settings = ", ".join(f"{name} {value:g}" for name, value in family_settings.items())
        return f"the family's settings: {settings}{invariant}"
    calibration = report.get("threshold_calibration")
    line = f"threshold {report['decoding']['threshold']:.6g}"
    if calibration:
        line += f" (calibrated: {calibration['fraction']} of first-forward confidences reach it)"
    return line + invariant
