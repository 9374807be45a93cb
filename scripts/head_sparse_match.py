"""Exact match of each head-sparse selection against the dense cache, at the same ratio and the same kept bytes.

Usage: python scripts/head_sparse_match.py --head-importance heads.json [--n 210] [--retentions 0.5,0.3,0.1]
    [--threads 1] [--json out.json]

Runs `dllm eval` (BlockServe, one token per step: ``--remasking low_confidence``, where the cache is read
32 times a block) on the shipped model once with the dense dual cache and once per cache of
engine_pod/bench/sparse_match.py, each as the `dllm eval` command line printed beside its row, and
prints a markdown table: the kept bytes over the dense cache's, the share of the dense run's greedy tokens
each run gives at the same place (token match), the share of whole answers identical to the dense run's,
and the tasks' exact match.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

logger = logging.getLogger("head_sparse_match")


def _flags(sparse) -> list[str]:
    from engine_pod.cli.sparse_args import SPARSE_FLAGS

    if not sparse.on:
        return []
    flags = [part for field, flag in SPARSE_FLAGS.items() for part in (flag, str(getattr(sparse, field)))]
    return flags + (["--head-importance", sparse.importance] if sparse.importance else [])


def _run(argv: list[str]) -> dict:
    """One `dllm eval` run in this process: its report with every example's tokens."""
    from engine_pod.cli.common import decoding_config
    from engine_pod.cli.main import build_parser
    from engine_pod.evaluation import EvalConfig, evaluate
    from engine_pod.loading.loader import load_model

    args = build_parser().parse_args(["eval", *argv])
    loaded = load_model(args.model, args.device, args.dtype, family=args.family)
    cfg = EvalConfig(n=args.n, seed=args.seed, max_tokens=args.max_tokens)
    return evaluate(loaded, decoding_config(args, args.steps_per_block), ["blockserve"], cfg)


def _tokens(report: dict) -> list[list[int]]:
    return [item["token_ids"] for item in report["_outputs"]["blockserve"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-importance", required=True, help="the JSON `dllm heads` wrote")
    parser.add_argument("--model", default="builtin:tiny-llada")
    parser.add_argument("--n", type=int, default=210, help="held-out examples (default: 210)")
    parser.add_argument("--retentions", default="0.5,0.3,0.1")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from engine_pod.bench.sparse_match import answers_identical, contenders, token_match
    from engine_pod.cpu_threads import set_torch_threads
    from engine_pod.loading.loader import load_metadata

    set_torch_threads(args.threads)
    common = ["--model", args.model, "--n", str(args.n), "--remasking", "low_confidence"]
    common += ["--threads", str(args.threads)]
    config = load_metadata(args.model)[0]
    retentions = [float(r) for r in args.retentions.split(",")]
    runs = contenders(retentions, config.num_kv_heads, args.head_importance)
    dense_report = _run(common)
    dense = _tokens(dense_report)
    figures = dense_report["policies"]["blockserve"]
    rows = [_row("dense", "-", "-", "-", figures, 1.0, 1.0, common)]
    for contender in runs:
        flags = common + _flags(contender.sparse)
        logger.info("%s at %s %s", contender.name, contender.basis, contender.target)
        report = _run(flags)
        tokens = _tokens(report)
        row = _row(
            contender.name,
            contender.target,
            contender.basis,
            contender.sparse.retention,
            report["policies"]["blockserve"],
            token_match(dense, tokens),
            answers_identical(dense, tokens),
            flags,
        )
        rows.append(row)
        _write(args.json, rows)  # after every run, so that a run cut short keeps what it measured
    _print(rows, args.threads)
    return 0


def _write(path: str | None, rows: list[dict]) -> None:
    if path:
        with open(path, "w") as out:
            json.dump(rows, out, indent=2)


def _row(name, target, basis, retention, figures: dict, match: float, identical: float, flags) -> dict:
    generation = figures["generation"]
    kept = generation["kv_kept_bytes"] / max(generation["kv_dense_bytes"], 1)
    return {
        "cache": name,
        "r": target,
        "basis": basis,
        "retention": retention,
        "kept_over_dense": round(kept, 3),
        "token_match": round(match, 4),
        "answers_identical": round(identical, 4),
        "exact_match": figures["exact_match"],
        "command": "dllm eval " + " ".join(flags),
    }


def _print(rows: list[dict], threads: int) -> None:
    lines = [
        f"torch threads: {threads}",
        "| r | at | cache | retention | kept / dense | token match | answers identical | exact match |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['r']} | {row['basis']} | {row['cache']} | {row['retention']} | {row['kept_over_dense']:.2f} | "
            f"{row['token_match']:.3f} | {row['answers_identical']:.3f} | {row['exact_match']:.3f} |"
        )
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
