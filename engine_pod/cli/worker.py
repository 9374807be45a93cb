"""``dllm worker``: an engine pod's process: BlockServe over the Redis queue of one service.

The serving stack (redis, the worker loop, the probe server) is imported when the command runs, so
that ``dllm`` itself starts on a bare device with only torch and the model libraries installed.
"""

from __future__ import annotations

import argparse
import logging
import os
from contextlib import ExitStack
from typing import TYPE_CHECKING

from dllm_contracts.model_identity import MODEL_IDENTITY_ENV, MODEL_NAME_ENV, ModelIdentity
from dllm_contracts.queue.keys import RESULT_TTL_S
from engine_pod.cli.common import (
    CliError,
    add_decoding_args,
    add_group_args,
    add_model_args,
    add_tensor_parallel_arg,
    check_logit_args,
    decoding_config,
    group_place,
)
from engine_pod.cli.scheduling import add_scheduler_args, scheduler_config
from engine_pod.cli.sparse_args import add_sparse_args
from engine_pod.cli.warm_prefix import add_warm_prefix_args, check_warm_family, warm_prefix_ids
from engine_pod.cpu_load import apply_threads, pin_threads
from engine_pod.scheduler.serving import SERVING_POLICIES

if TYPE_CHECKING:
    from engine_pod.worker.worker import Worker

logger = logging.getLogger(__name__)
TRACED_AS = "dllm-worker"  # the traces' service.name unless OTEL_SERVICE_NAME says otherwise


def add_worker_args(parser: argparse.ArgumentParser) -> None:
    """The worker's flags that ``dllm serve`` shares: the policy, its settings (budget included), leases,
    draining, tensor parallelism."""
    add_scheduler_args(parser)
    parser.add_argument(
        "--policy",
        choices=SERVING_POLICIES,
        default=SERVING_POLICIES[0],
        help="blockserve (the default); dllm-serve (BlockServe's batches with each step's refreshes held to "
        "--refresh-quota, so a budget admits more rows); or a baseline behind the same queue to measure "
        "against them: static (batches of --batch-size in arrival order, each run until its slowest row is "
        "done, as Fast-dLLM does) or sequential (one request at a time)",
    )
    parser.add_argument("--batch-size", type=int, default=1, help="static's batch size (default: 1)")
    add_tensor_parallel_arg(parser)
    parser.add_argument(
        "--steps-per-block", type=int, default=32, help="denoising steps per block (default: 32)"
    )
    parser.add_argument(
        "--lease-ms", type=int, default=30_000, help="claim lease; renewed every third (default: 30000)"
    )
    parser.add_argument(
        "--drain-timeout", type=float, default=60.0, help="seconds to finish work after SIGTERM"
    )
    parser.add_argument(
        "--result-ttl",
        type=int,
        default=RESULT_TTL_S,
        help=f"seconds a finished request's record and result stay in Redis (default: {RESULT_TTL_S})",
    )
    add_warm_prefix_args(parser)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="serve a queue: the engine process of one pod",
        description="Claim requests from the service's Redis sorted set (sand filling under the token budget), "
        "run BlockServe block cycles, publish each committed block and each result. SIGTERM drains.",
    )
    add_model_args(parser)
    parser.add_argument(
        "--redis",
        required=True,
        help="Redis URL, e.g. redis://127.0.0.1:6379/0, or redis+cluster://NODE:PORT for a Redis Cluster "
        "(password: in the URL or $REDIS_PASSWORD)",
    )
    parser.add_argument("--service", required=True, help="service name (queue key prefix)")
    parser.add_argument("--worker-id", default="", help="default: hostname-pid")
    parser.add_argument(
        "--threads-reserve",
        type=int,
        default=0,
        metavar="N",
        help="without --threads or $DLLM_THREADS: CPUs the default thread count leaves to neighbours on the "
        "same machine (dllm serve passes 1, for its gateway and Redis; default: 0)",
    )
    parser.add_argument(
        "--model-identity",
        default=os.environ.get(MODEL_IDENTITY_ENV, ""),
        help="NAME@FINGERPRINT of the model this worker serves, as the service's gateways stamp requests "
        "with it: a request accepted for another model ends with an error instead of an answer from "
        f"these weights (default: ${MODEL_IDENTITY_ENV}; unset: no check; dllm serve and the operator set it)",
    )
    parser.add_argument(
        "--model-name",
        default="",
        help="the served model's name, as the gateway's clients pass it: the model label of this worker's "
        f"metrics (default: the name in --model-identity, else ${MODEL_NAME_ENV}, as the gateway reads it, "
        "else --model's: a directory's name, NAME of builtin:NAME, a repo id's last part)",
    )
    add_worker_args(parser)
    add_group_args(parser)
    parser.add_argument(
        "--host", default="0.0.0.0", help="address of /metrics, /healthz, /readyz (default: 0.0.0.0)"
    )
    parser.add_argument(
        "--port", type=int, default=9090, help="port of /metrics, /healthz, /readyz (0: none)"
    )
    add_decoding_args(parser)
    add_sparse_args(parser)
    parser.set_defaults(handler=run)


def build_worker(args: argparse.Namespace, redis_url: str, service: str, held: ExitStack) -> Worker:
    """The worker of these flags; ``held`` keeps its tensor-parallel group (the other ranks' processes)
    for as long as the worker runs."""
    from dllm_contracts.tracing import Tracing
    from engine_pod.group_processes import tensor_parallel_group
    from engine_pod.runner.factory import make_runner
    from engine_pod.worker.config import WorkerConfig
    from engine_pod.worker.worker import Worker

    decoding = decoding_config(args, args.steps_per_block)
    scheduling = scheduler_config(args)
    if args.result_ttl < 1:
        raise CliError(f"--result-ttl must be positive, got {args.result_ttl}")
    if decoding.sparse.on and scheduling.layout != "packed":
        raise CliError("--sparse-cache runs packed rows only: drop --layout dense")
    if getattr(args, "batch_size", 1) < 1:
        raise CliError(f"--batch-size must be positive, got {args.batch_size}")
    tracing_config = _tracing_config()
    check_warm_family(args)  # before any weight is read
    warm_prefixes = warm_prefix_ids(args)
    loaded = held.enter_context(tensor_parallel_group(group_place(args), model_args(args)))
    config = WorkerConfig(
        redis_url=redis_url,
        service=service,
        scheduling=scheduling,
        worker_id=getattr(args, "worker_id", ""),
        lease_ms=args.lease_ms,
        drain_timeout_s=args.drain_timeout,
        result_ttl_s=args.result_ttl,
        policy=getattr(args, "policy", SERVING_POLICIES[0]),
        batch_size=getattr(args, "batch_size", 1),
        model_identity=_identity(getattr(args, "model_identity", "")),
        served_name=served_name(args),
        warm_prefixes=warm_prefixes,
    )
    runner = make_runner(loaded, decoding, scheduling.token_budget)
    return Worker(runner, config, tracing=Tracing.start(tracing_config))


def model_args(args: argparse.Namespace):
    """What each rank of the worker's group loads, with its share of this process's threads."""
    import torch

    from engine_pod.group_processes import ModelArgs

    per_node = group_place(args).per_node
    per_rank = max(1, torch.get_num_threads() // per_node)
    if per_node > 1:
        pin_threads(per_rank)
    return ModelArgs(args.model, args.device, args.dtype, family=args.family, threads=per_rank)


def follow_group(args: argparse.Namespace) -> int:
    """Another node's ranks of the group: compute what node 0 sends until it stops (no queue, no probes
    of a worker: the pod lives as long as its group)."""
    from engine_pod.group_processes import tensor_parallel_group
    from engine_pod.runner.factory import make_runner
    from engine_pod.runner.tensor_parallel import follow

    with tensor_parallel_group(group_place(args), model_args(args)) as loaded:
        follow(loaded, make_runner)
    return 0


def _tracing_config():
    """Where traces go (OpenTelemetry's variables; none set: no tracing)."""
    from dllm_contracts.tracing_config import TracingConfig

    try:
        return TracingConfig.from_env(TRACED_AS)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def served_name(args: argparse.Namespace) -> str:
    """The served model's name, the model label of the worker's metrics, whatever starts it: the name in
    its model identity (dllm serve, the operator), else ``--model-name``, else ``$DLLM_MODEL_NAME`` (as the
    gateway reads it), else ``--model``'s own (a worker started by hand beside ``python -m gateway`` on the
    same model: the gateway's name for it)."""
    from dllm_contracts.model_source import default_served_name

    identity = _identity(getattr(args, "model_identity", ""))
    chosen = getattr(args, "model_name", "")
    if identity is not None and chosen and chosen != identity.name:
        raise CliError(f"--model-name {chosen!r} is not the name in --model-identity ({identity.name!r})")
    if identity is not None:
        return identity.name
    return chosen or os.environ.get(MODEL_NAME_ENV) or default_served_name(args.model)


def _identity(text: str) -> ModelIdentity | None:
    try:
        return ModelIdentity.parse(text) if text else None
    except ValueError as exc:
        raise CliError(f"--model-identity: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from engine_pod.worker.http import ProbeSource, serve_probes

    place = group_place(args)  # sizes that make no group: refused before anything starts
    check_logit_args(args)
    if args.threads_reserve < 0:
        raise CliError(f"--threads-reserve must not be negative, got {args.threads_reserve}")
    apply_threads(args.threads, reserve=args.threads_reserve)
    if place.node > 0:
        return follow_group(args)
    probes = ProbeSource()  # up before the model loads: a long download is alive, not restarted
    server = serve_probes(args.host, args.port, probes) if args.port else None
    with ExitStack() as held:
        try:
            worker = build_worker(args, args.redis, args.service, held)
        except BaseException:
            if server is not None:
                server.shutdown()
            raise
        return _serve(worker, args, server, probes)


def _serve(worker: Worker, args: argparse.Namespace, server, probes) -> int:
    """Run the built worker until it stops (its probes' server shut down then)."""
    worker.install_signal_handlers()
    probes.attach(worker.metrics.registry, worker.ready)
    logger.info(
        "worker %s serving %s (token budget %d)",
        worker.worker_id,
        args.service,
        worker.config.scheduling.token_budget,
    )
    try:
        worker.run()
    finally:
        if server is not None:
            server.shutdown()
    return 0
