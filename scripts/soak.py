"""Soak test (not in CI): minutes of load on real processes with random faults, and memory over time.

The stack is the fault tests' (`tests/serving/outage_harness.py`): `python -m gateway`, two `dllm worker`
and a redis-server with its append-only file. Load runs in rounds of 200 requests (every fourth one
streamed) at concurrency 16; every `--fault-every` seconds on average one fault from the fault tests'
(a) kill -9 a worker and restart it, (b) kill -9 Redis and restart it, (c) freeze Redis for 5 s.
Reports sent / completed / lost / duplicated / 5xx and samples the resident memory of the gateway and
each worker; writes a JSON report and a plot.

    python scripts/soak.py --minutes 20 --out docs/results/soak
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.serving.outage_harness import Stack, Tally, start_load  # noqa: E402
from tests.serving.test_outages import MAX_TOKENS, PROMPTS  # noqa: E402
from tests.serving_utils import write_served_model  # noqa: E402

logger = logging.getLogger("soak")


def resident_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def kill_worker(stack: Stack) -> None:
    victim = stack.workers[0]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    stack.workers[0] = stack.start_worker(0)


FAULTS = {
    "(a) kill -9 worker": kill_worker,
    "(b) kill -9 Redis, restart": Stack.restart_redis,
    "(c) freeze Redis 5 s": lambda stack: stack.freeze_redis(5.0),
}


class Soak:
    def __init__(self, stack: Stack, seconds: float, fault_every_s: float, seed: int) -> None:
        self.stack, self.seconds, self.fault_every_s = stack, seconds, fault_every_s
        self.random = random.Random(seed)
        self.started = time.monotonic()
        self.samples: list[dict] = []
        self.faults: list[dict] = []
        self.lock = threading.Lock()  # faults replace processes the sampler reads

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def run(self) -> dict:
        threads = [threading.Thread(target=f, daemon=True) for f in (self._inject, self._sample)]
        for thread in threads:
            thread.start()
        tallies = []
        while self.elapsed() < self.seconds:
            outcomes = start_load(self.stack.gateway.url, PROMPTS, MAX_TOKENS).result(timeout=900)
            tallies.append(Tally(outcomes, 0).row())
            logger.info("%.0f s: round %d %s", self.elapsed(), len(tallies), tallies[-1])
        for thread in threads:
            thread.join(timeout=30)
        totals = {k: sum(t[k] for t in tallies) for k in ("sent", "completed", "lost", "5xx")}
        totals["duplicated"] = self.stack.duplicate_results()
        return {
            "seconds": round(self.elapsed()),
            "totals": totals,
            "faults": self.faults,
            "samples": self.samples,
        }

    def _inject(self) -> None:
        while True:
            time.sleep(self.random.expovariate(1 / self.fault_every_s))
            if self.elapsed() >= self.seconds - 30:  # let the last round finish cleanly
                return
            name = self.random.choice(sorted(FAULTS))
            with self.lock:
                logger.info("%.0f s: fault %s", self.elapsed(), name)
                self.faults.append({"t": round(self.elapsed(), 1), "fault": name})
                FAULTS[name](self.stack)

    def _sample(self) -> None:
        while self.elapsed() < self.seconds:
            with self.lock:
                pids = {"gateway": self.stack.gateway.process.pid}
                pids |= {f"worker {i}": w.pid for i, w in enumerate(self.stack.workers)}
            row = {"t": round(self.elapsed(), 1)} | {name: resident_mib(pid) for name, pid in pids.items()}
            self.samples.append(row)
            time.sleep(5.0)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 4))
    samples = report["samples"]
    for name in ("gateway", "worker 0", "worker 1"):
        points = [(s["t"] / 60, s[name]) for s in samples if s.get(name)]
        axis.plot([p[0] for p in points], [p[1] for p in points], label=name)
    for fault in report["faults"]:
        axis.axvline(fault["t"] / 60, color="grey", alpha=0.3, linewidth=1)
    totals = report["totals"]
    axis.set_title(
        f"soak: {totals['sent']} requests, {totals['lost']} lost, {totals['duplicated']} duplicated, "
        f"{totals['5xx']} 5xx; {len(report['faults'])} faults (grey lines)"
    )
    axis.set_xlabel("minutes")
    axis.set_ylabel("resident memory (MiB)")
    axis.set_ylim(bottom=0)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="how long to run (default: 20)")
    parser.add_argument(
        "--fault-every", type=float, default=60.0, help="mean seconds between faults (default: 60)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/results/soak", help="writes OUT.json and OUT.png")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="dllm-soak-") as tmp:
        model = write_served_model(Path(tmp) / "model")
        with Stack(model, "soak", Path(tmp)) as stack:
            report = Soak(stack, args.minutes * 60, args.fault_every, args.seed).run()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out.with_suffix(".png"))
    logger.info("totals %s; wrote %s.json and .png", report["totals"], out)
    return (
        0 if report["totals"]["lost"] == report["totals"]["duplicated"] == report["totals"]["5xx"] == 0 else 1
    )


if __name__ == "__main__":
    sys.exit(main())
