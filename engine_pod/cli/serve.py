"""``dllm serve``: the main job on one machine: private Redis, gateway and one worker; prints the URL.

Like ``dllm worker``, it imports the serving stack only when it runs (``dllm`` must start on a bare device).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from engine_pod.cli.budget import add_budget_args
from engine_pod.cli.common import CliError, add_decoding_args, add_model_args
from engine_pod.cli.worker import add_worker_args, build_worker

logger = logging.getLogger(__name__)


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
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    parser.add_argument("--redis-dir", help="keep Redis data here with append-only persistence")
    parser.add_argument("--api-key", action="append", default=[], help="require this bearer key (repeatable)")
    parser.add_argument(
        "--max-queued", type=int, default=10_000, help="queue depth that answers 429 (default: 10000)"
    )
    parser.add_argument(
        "--max-tokens-limit", type=int, default=512, help="largest max_tokens accepted (default: 512)"
    )
    parser.add_argument("--metrics-port", type=int, default=0, help="worker /metrics port (default: none)")
    add_budget_args(parser)
    add_worker_args(parser)
    add_decoding_args(parser)
    parser.set_defaults(handler=run)


def _gateway_env(args: argparse.Namespace, model_dir: Path, redis_url: str) -> dict[str, str]:
    return {
        "DLLM_REDIS_URL": redis_url,
        "DLLM_SERVICE": args.service,
        "DLLM_MODEL_DIR": str(model_dir),
        "DLLM_MODEL_NAME": args.model_name or model_dir.name,
        "DLLM_API_KEYS": ",".join(args.api_key),
        "DLLM_MAX_QUEUED": str(args.max_queued),
        "DLLM_MAX_TOKENS": str(args.max_tokens_limit),
        "DLLM_BLOCK_LENGTH": str(args.block_length),
        "DLLM_STEPS_PER_BLOCK": str(args.steps_per_block),
        "DLLM_THRESHOLD": str(args.threshold),
    }


def run(args: argparse.Namespace) -> int:
    from engine_pod.models.loader import resolve_model_dir
    from engine_pod.serve.gateway_process import GatewayProcess
    from engine_pod.serve.redis_server import RedisServer
    from engine_pod.worker.http import serve_probes

    if args.model.startswith("random:"):
        raise CliError("dllm serve needs a model with a tokenizer; random models have none")
    model_dir = resolve_model_dir(args.model)
    if not (model_dir / "tokenizer.json").is_file():
        raise CliError(f"{model_dir} has no tokenizer.json; the gateway needs one")
    redis_server = (
        None
        if args.redis_url
        else RedisServer(data_dir=args.redis_dir, appendonly=bool(args.redis_dir)).start()
    )
    redis_url = args.redis_url or redis_server.url
    gateway = None
    try:
        worker = build_worker(args, redis_url, args.service)
        gateway = GatewayProcess(args.host, args.port, _gateway_env(args, model_dir, redis_url)).start()
        probes = (
            serve_probes("127.0.0.1", args.metrics_port, worker.metrics.registry, worker.ready)
            if args.metrics_port
            else None
        )
        worker.install_signal_handlers()
        sys.stdout.write(
            f"dllm serve: OpenAI-compatible API at {gateway.url}/v1 (model {args.model_name or model_dir.name}); Ctrl-C stops\n"
        )
        sys.stdout.flush()
        worker.run()
        if probes is not None:
            probes.shutdown()
    finally:
        if gateway is not None:
            gateway.stop()
        if redis_server is not None:
            redis_server.stop()
    return 0
