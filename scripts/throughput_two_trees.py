"""BlockServe's throughput of two source trees of this project, measured in one run with their rounds
interleaved (before, after, before, after, ...), so that the host's load falls on both alike.

Each run is ``dllm bench`` of one tree (``python -m engine_pod.cli.main`` with that tree first on the
path, as the ``dllm`` command starts it: under glibc's huge-page tunable), one policy, one model, one
torch thread. Before measuring, the script checks that each tree's packages are imported from that tree.
It prints, per model, each tree's median tokens per second and tokens per engine CPU second over the
rounds (with their ranges), the ratio after/before, whether every run of both trees generated the same
tokens, and the host's load average over the runs.

Example (a worktree of the earlier commit beside this checkout)::

    git worktree add /tmp/before <commit>
    python scripts/throughput_two_trees.py --before /tmp/before --rounds 5 --json two-trees.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("throughput_two_trees")
HERE = Path(__file__).resolve().parents[1]
MODELS = "random:llada-tiny,random:llada2-tiny,random:diffusion-gemma-tiny"
PACKAGES = ("engine_pod", "gateway", "dllm_contracts", "dllm_operator")
# what the dllm command starts itself under (engine_pod/cli/huge_pages.py)
TUNABLES = "glibc.malloc.hugetlb=1"


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs ``tree``'s code: its folders first on the path."""
    path = os.pathsep.join(filter(None, (str(tree), str(tree / "operator"), os.environ.get("PYTHONPATH"))))
    return os.environ | {"PYTHONPATH": path, "GLIBC_TUNABLES": TUNABLES}


def check_imports(tree: Path) -> None:
    """SystemExit unless each package is imported from ``tree`` under ``tree_env``."""
    probe = "import importlib, sys; print(*(importlib.import_module(n).__file__ for n in sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", probe, *PACKAGES], env=tree_env(tree), cwd=tree, capture_output=True, text=True
    )
    files = done.stdout.split()
    if done.returncode != 0 or len(files) != len(PACKAGES):
        raise SystemExit(f"{tree}: cannot import its packages: {done.stderr.strip()[-300:]}")
    foreign = [f for f in files if not Path(f).resolve().is_relative_to(tree)]
    if foreign:
        raise SystemExit(f"{tree}: packages imported from elsewhere: {', '.join(foreign)}")


def bench(tree: Path, model: str, args: argparse.Namespace, extra: list[str]) -> dict:
    """One ``dllm bench`` run of ``tree``: its report's policy figures, its outputs' digest, the load."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "engine_pod.cli.main", "bench", "--model", model]
        command += ["--workload", args.workload, "--policy", args.policy, "--threads", str(args.threads)]
        command += ["--no-margins", "--json", str(report)]
        command += ["--limit", str(args.limit)] if args.limit else []
        load = os.getloadavg()[0]
        done = subprocess.run(
            [*command, *extra], env=tree_env(tree), cwd=tree, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"{tree}: dllm bench {model} failed: {done.stderr.strip()[-600:]}")
        data = json.loads(report.read_text())
    figures = data["policies"][args.policy]
    return {
        "tokens_per_s": figures["tokens_per_s"],
        "tokens_per_cpu_s": figures["tokens_per_cpu_s"],
        "wall_s": figures["wall_s"],
        "outputs_sha256": data["outputs_sha256"][args.policy],
        "load_1min": round(load, 2),
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def summary(runs: dict[str, dict[str, list[dict]]]) -> list[str]:
    """A markdown table: per model, each tree's medians and ranges, the ratios, identical outputs."""
    lines = [
        "| model | tok/s before | tok/s after | after/before | tok/CPU-s before | tok/CPU-s after | "
        "after/before | outputs identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, sides in runs.items():
        cells = [model]
        for key in ("tokens_per_s", "tokens_per_cpu_s"):
            before = [run[key] for run in sides["before"]]
            after = [run[key] for run in sides["after"]]
            ratio = statistics.median(after) / statistics.median(before)
            cells += [spread(before), spread(after), f"{ratio:.3f}"]
        digests = {run["outputs_sha256"] for side in sides.values() for run in side}
        cells.append("yes" if len(digests) == 1 else f"no ({len(digests)} digests)")
        lines.append("| " + " | ".join(cells) + " |")
    loads = [run["load_1min"] for sides in runs.values() for side in sides.values() for run in side]
    lines.append(f"\nload average (1 min) at the runs' starts: {min(loads)}-{max(loads)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="the earlier tree (a git worktree)")
    parser.add_argument("--after", type=Path, default=HERE, help="the later tree (default: this checkout)")
    parser.add_argument("--models", default=MODELS, help=f"comma-separated (default: {MODELS})")
    parser.add_argument("--workload", default="heterogeneous", help="dllm bench's (default: heterogeneous)")
    parser.add_argument("--policy", default="blockserve", help="one dllm bench policy (default: blockserve)")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each tree per model (default: 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default: 1)")
    parser.add_argument("--limit", type=int, help="only the workload's first N requests (default: all)")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument("bench_args", nargs="*", help="after --: more dllm bench flags, for both trees")
    args = parser.parse_args()
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for tree in trees.values():
        check_imports(tree)
    runs: dict[str, dict[str, list[dict]]] = {}
    for model in args.models.split(","):
        runs[model] = {"before": [], "after": []}
        for round_index in range(args.rounds):
            for side, tree in trees.items():
                run = bench(tree, model, args, args.bench_args)
                runs[model][side].append(run)
                figures = (run["tokens_per_s"], run["load_1min"])
                log.info("%s round %d %s: %.1f tok/s, load %.2f", model, round_index + 1, side, *figures)
                if args.json:
                    args.json.write_text(
                        json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "runs": runs})
                    )
    print("\n".join(summary(runs)))


if __name__ == "__main__":
    main()
