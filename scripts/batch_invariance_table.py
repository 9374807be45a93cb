"""How many requests a batch rounds otherwise than alone, per family, with ``--batch-invariant`` and
without, under every kernel regime this CPU can be made to run (tests/kernel_regimes.py: MKL's code paths
and its Intel kernels forced on any x86 CPU): the table of docs/design.md, "Batch invariance on a GPU".

Each cell counts the requests of tests/engine_pod/test_batch_invariant.py's workload (float32, one torch
thread, the random ``*-tiny`` presets) whose tokens or log probabilities differ from theirs alone, in
BlockServe's and static batches: packed (the more of the two), then dense (likewise); ``tokens`` says
where a token changed too.

Usage: python scripts/batch_invariance_table.py [--families llada,dream,llada2,sdar,diffusion-gemma]
    [--regimes default,mkl-vendor-neutral,mkl-avx2,mkl-intel-kernels]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAMILIES = ("llada", "dream", "llada2", "sdar", "diffusion-gemma")
REGIMES = ("default", "mkl-vendor-neutral", "mkl-avx2", "mkl-intel-kernels")  # tests/kernel_regimes.py's

logger = logging.getLogger("batch_invariance_table")


def _differing(families: list[str]) -> dict:
    """In this process's regime: per family and setting, the requests each batching rounds otherwise."""
    from tests.engine_pod.test_batch_invariant import _loaded, _outputs

    models, counts = {}, {}
    for family in families:
        for on in (True, False):
            outputs = _outputs(_loaded(models, family), family, on)
            alone = outputs.pop("alone")
            counts[f"{family}:{'on' if on else 'off'}"] = {
                batching: [
                    sum(got[r] != alone[r] for r in alone),
                    sum(got[r][0] != alone[r][0] for r in alone),
                ]
                for batching, got in outputs.items()
            } | {"requests": len(alone)}
    return counts


def _cell(counts: dict) -> str:
    n = counts["requests"]
    packed = max(counts["blockserve-packed"][0], counts["static-packed"][0])
    dense = max(counts["blockserve-dense"][0], counts["static-dense"][0])
    tokens = any(value[1] for key, value in counts.items() if key != "requests")
    return f"packed {packed}/{n}, dense {dense}/{n}" + (", tokens" if tokens else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated (default: all five)")
    parser.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated (default: all four)")
    parser.add_argument("--in-regime", action="store_true", help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args()
    families = [name for name in args.families.split(",") if name]
    unknown = sorted(set(families) - set(FAMILIES)) + sorted(set(args.regimes.split(",")) - set(REGIMES))
    if unknown:
        parser.error(f"unknown families or regimes: {', '.join(unknown)}")
    if args.in_regime:
        import torch

        torch.set_num_threads(1)
        print(json.dumps(_differing(families)))
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from tests.kernel_regimes import regime_env

    table: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="kernel-regimes-") as build:
        for regime in args.regimes.split(","):
            logger.info("running the comparisons under %s", regime)
            try:
                env = regime_env(regime, Path(build))
            except BaseException as exc:  # pytest's skip where no C compiler builds the Intel-kernels shim
                if isinstance(exc, KeyboardInterrupt):
                    raise
                sys.exit(f"{regime}: {exc}")
            run = subprocess.run(
                [sys.executable, __file__, "--in-regime", "--families", ",".join(families)],
                env=env,
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            if run.returncode:
                sys.exit(f"{regime}: {run.stderr.strip().splitlines()[-1]}")
            table[regime] = json.loads(run.stdout.splitlines()[-1])
    regimes = list(table)
    print("| family | setting | " + " | ".join(regimes) + " |")
    print("|---|---|" + "---|" * len(regimes))
    for family in families:
        for setting in ("on", "off"):
            cells = [_cell(table[regime][f"{family}:{setting}"]) for regime in regimes]
            print(f"| {family} | {setting} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
