"""Where a burst's time goes through the serving path, outside the block cycles.

    python scripts/burst_breakdown.py [--workload homogeneous] [--runs 6]

Runs the ``gateway`` benchmark policy (client -> ``python -m gateway`` -> Redis -> one worker on this
process's main thread) on a shipped workload, ``--runs`` times in this process, and prints per run: the
time from the client's first send to the last enqueue (Redis's clock, the requests' ``enqueued`` field),
from the last enqueue to the first block cycle (the batch window's pause and the claim), the cycles'
span, and from the last cycle to the last answer the client received (a negative second figure: the
first cycle started before the whole burst was in). the table of where a burst's time goes outside
the block cycles was measured this way.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import redis

from dllm_contracts.defaults import DEFAULT_MODEL
from dllm_contracts.heap import freeze_loaded_objects
from dllm_contracts.queue.keys import ServiceKeys
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod import engine as engine_module
from engine_pod.allocators import tune_cpu_allocator
from engine_pod.bench.policies import PolicySpec
from engine_pod.bench.workloads import load_workload
from engine_pod.decoding.config import DecodingConfig


class Recorder:
    """Wall-clock instants of the block cycles, the timed burst's start and end, and its enqueue times."""

    def __init__(self) -> None:
        self.cycles: list[tuple[float, float]] = []  # (begin, end), time.time()
        self.bursts: list[tuple[float, float, int]] = []  # (start, end, requests), time.time()
        self.enqueued: dict[str, float] = {}  # queue id -> when Redis took it (seconds)

    def install(self) -> None:
        from engine_pod.bench import through_gateway  # torch: loaded here, so --help answers at once

        step, submit, stack = (
            engine_module.Engine.step,
            through_gateway._submit_all,
            through_gateway.serving_stack,
        )
        recorder = self

        def timed_step(engine):
            begin = time.time()
            result = step(engine)
            if result.blocks or result.finished:
                recorder.cycles.append((begin, time.time()))
            return result

        async def timed_submit(url, requests):
            start = time.time()
            ids, latencies = await submit(url, requests)
            recorder.bursts.append((start, time.time(), len(requests)))
            return ids, latencies

        @contextlib.contextmanager
        def reading_stack(*args):
            with stack(*args) as served:
                serve_while = served.serve_while

                def serve_and_read(load):
                    out = serve_while(load)
                    client, keys = (
                        redis.Redis.from_url(served.redis_url),
                        ServiceKeys(through_gateway.SERVICE),
                    )
                    for queue_id in out[0].values():
                        recorder.enqueued[queue_id] = (
                            int(client.hget(keys.request(queue_id), "enqueued")) / 1000
                        )
                    return out

                served.serve_while = serve_and_read
                yield served

        engine_module.Engine.step = timed_step
        through_gateway._submit_all = timed_submit
        through_gateway.serving_stack = reading_stack


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="homogeneous", help="a shipped workload (default: homogeneous)")
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    from engine_pod.bench import through_gateway  # torch: loaded once the arguments are read
    from engine_pod.bench.prepare import prepare_requests
    from engine_pod.loading.loader import load_metadata, load_model

    tune_cpu_allocator()  # as every dllm command does
    config, tokenizer = load_metadata(DEFAULT_MODEL)
    requests = prepare_requests(load_workload(args.workload), config, tokenizer, 0)
    loaded = load_model(DEFAULT_MODEL, "cpu", "float32")
    decoding = DecodingConfig(block_length=32, steps_per_block=32, remasking="threshold", threshold=0.9)
    spec = PolicySpec("gateway", SchedulerConfig(token_budget=8192), 21)
    recorder = Recorder()
    recorder.install()
    freeze_loaded_objects()
    rows = []
    for _ in range(args.runs):
        recorder.cycles.clear()
        recorder.enqueued.clear()
        run = through_gateway.run_through_gateway(loaded, decoding, spec, requests)
        start, end, _ = next(b for b in reversed(recorder.bursts) if b[2] == len(requests))
        cycles = [c for c in recorder.cycles if c[0] >= start]
        last_enqueue = max(recorder.enqueued.values())
        rows.append(
            (
                last_enqueue - start,
                cycles[0][0] - last_enqueue,
                cycles[-1][1] - cycles[0][0],
                end - cycles[-1][1],
                run.wall_s,
                run.cycles[0].rows,
            )
        )
        print(
            "first send to last enqueue {:.3f} s, to first cycle {:.3f} s, cycles {:.3f} s, last cycle to "
            "last answer {:.3f} s; wall {:.3f} s, first cycle's rows {}".format(*rows[-1]),
            flush=True,
        )
    medians = [statistics.median(column) for column in list(zip(*rows))[:5]]
    print("medians: {:.3f} {:.3f} {:.3f} {:.3f}; wall {:.3f}".format(*medians))


if __name__ == "__main__":
    main()
