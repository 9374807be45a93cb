"""``dllm serve``: the main job on one machine, supervised: a private Redis, one worker and the gateway.

Each runs as a child process that is restarted (with backoff) when it dies; SIGTERM or Ctrl-C stops
the gateway, then the worker (both drain), then Redis, and exits 0. Redis keeps an append-only file
in a data directory (under the user's cache by default), so accepted requests survive a restart of
Redis or of ``dllm serve`` itself. Like ``dllm worker``, this module imports the serving stack only
when it runs (``dllm`` must start on a bare device).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from engine_pod.cli.budget import resolve_budget
from engine_pod.cli.common import CliError, add_decoding_args, add_model_args
from engine_pod.cli.scheduling import admission_flags, scheduler_config
from engine_pod.cli.worker import add_worker_args

logger = logging.getLogger(__name__)

DRAIN_S = 10.0  # the gateway's drain after SIGTERM under dllm serve


def default_data_dir(service: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "dllm" / "serve" / service


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-style API on this machine (Redis + gateway + one worker)",
        description="Start a private redis-server, the gateway and one BlockServe worker on the model "
        "(default: the shipped model), print the API URL, and serve until Ctrl-C.",
    )
    add_model_args(parser)
    parser.add_argument("--host", default="127.0.0.1", help="gateway address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="gateway port (default: 8000)")
    parser.add_argument("--service", default="default", help="queue name (default: default)")
    parser.add_argument("--model-name", help="model id clients pass (default: the model directory's name)")
    parser.add_argument(
        "--redis-url",
        help="use this Redis instead of starting one (redis://..., or redis+cluster://NODE:PORT for a Redis Cluster)",
    )
    parser.add_argument(
        "--data-dir",
        help="where the private Redis keeps its append-only file "
        "(default: $XDG_CACHE_HOME/dllm/serve/SERVICE, or ~/.cache/dllm/serve/SERVICE)",
    )
    parser.add_argument("--api-key", action="append", default=[], help="require this bearer key (repeatable)")
    parser.add_argument(
        "--max-queued", type=int, default=10_000, help="queue depth that answers 429 (default: 10000)"
    )
    parser.add_argument(
        "--max-tokens-limit", type=int, default=512, help="largest max_tokens accepted (default: 512)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="worker /metrics, /healthz, /readyz port (default: any free)",
    )
    add_worker_args(parser)
    add_decoding_args(parser)
    parser.set_defaults(handler=run)


def _gateway_env(args: argparse.Namespace, model_dir: Path, redis_url: str) -> dict[str, str]:
    from gateway.settings import GatewaySettings

    settings = GatewaySettings(
        redis_url=redis_url,
        service=args.service,
        model_dir=str(model_dir),
        model_name=args.model_name or model_dir.name,
        api_keys=tuple(args.api_key),
        max_queued=args.max_queued,
        max_tokens_limit=args.max_tokens_limit,
        default_max_tokens=min(GatewaySettings.default_max_tokens, args.max_tokens_limit),
        block_length=args.block_length,
        steps_per_block=args.steps_per_block,
        threshold=args.threshold,
        drain_timeout_s=DRAIN_S,
        result_ttl_s=args.result_ttl,
    )
    return settings.to_env()


def _worker_args(args: argparse.Namespace, redis_url: str) -> list[str]:
    """The ``dllm worker`` command line that runs what ``args`` asked ``dllm serve`` for."""
    budget = ["--profile", args.profile] if args.profile else ["--token-budget", str(resolve_budget(args))]
    decoding = [
        *("--block-length", str(args.block_length), "--remasking", args.remasking),
        *("--threshold", str(args.threshold), "--cache", args.cache, "--canvas", args.canvas),
        *(["--ignore-eos"] if args.ignore_eos else []),
    ]
    return [
        *("--model", args.model, "--device", args.device, "--dtype", args.dtype),
        *("--redis", redis_url, "--service", args.service, *budget),
        *admission_flags(scheduler_config(args)),
        *("--steps-per-block", str(args.steps_per_block)),
        *("--lease-ms", str(args.lease_ms), "--drain-timeout", str(args.drain_timeout)),
        *("--result-ttl", str(args.result_ttl)),
        *decoding,
    ]


def run(args: argparse.Namespace) -> int:
    from engine_pod.models.loader import resolve_model_dir
    from engine_pod.serve.gateway_process import GatewayProcess
    from engine_pod.serve.redis_server import RedisServer, free_port
    from engine_pod.serve.supervisor import ChildCannotStart, Supervised, Supervisor, child_popen_options
    from engine_pod.serve.worker_process import WorkerProcess

    if args.model.startswith("random:"):
        raise CliError("dllm serve needs a model with a tokenizer; random models have none")
    model_dir = resolve_model_dir(args.model)
    if not (model_dir / "tokenizer.json").is_file():
        raise CliError(f"{model_dir} has no tokenizer.json; the gateway needs one")
    options = child_popen_options()
    children = []
    redis_url = args.redis_url
    if not redis_url:
        data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir(args.service)
        data_dir.mkdir(parents=True, exist_ok=True)
        redis = RedisServer(data_dir=str(data_dir), appendonly=True, popen_options=options)
        children.append(Supervised("redis-server", redis))
        redis_url = redis.url
        logger.info("Redis data (append-only file) in %s", data_dir)
    probe_port = args.metrics_port or free_port()
    worker = WorkerProcess(_worker_args(args, redis_url), probe_port, options, stop_s=args.drain_timeout + 10)
    gateway_env = _gateway_env(args, model_dir, redis_url)
    gateway = GatewayProcess(args.host, args.port, gateway_env, options, stop_s=DRAIN_S + 5)
    children += [Supervised("worker", worker), Supervised("gateway", gateway)]
    supervisor = Supervisor(children)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: supervisor.stop())
    try:
        supervisor.start_all()
    except ChildCannotStart as exc:
        raise CliError(str(exc)) from None
    name = args.model_name or model_dir.name
    sys.stdout.write(f"dllm serve: OpenAI-compatible API at {gateway.url}/v1 (model {name}); Ctrl-C stops\n")
    sys.stdout.flush()
    try:
        supervisor.watch()
    finally:
        supervisor.stop_all()
    logger.info("dllm serve stopped")
    return 0
