"""``dllm serve``: the main job on one machine, supervised: a private Redis, one worker and the gateway.

Each runs as a child process that is restarted (with backoff) when it dies; SIGTERM or Ctrl-C stops
the gateway, then the worker (both drain), then Redis, and exits 0. Redis keeps an append-only file
in a data directory (under the user's cache by default): accepted requests survive a restart of Redis
or of a worker, and batches a restart of ``dllm serve`` itself (an interactive request lives as long as its
client's connection, which a stop of ``dllm serve`` ends). Like ``dllm worker``, this module imports the serving stack only
when it runs (``dllm`` must start on a bare device).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from dataclasses import replace
from pathlib import Path

from dllm_contracts.model_identity import ON_MODEL_CHANGE, ModelIdentity, ServedRecord
from dllm_contracts.model_source import portable_name
from dllm_contracts.request_params import FAMILY_SETTINGS
from dllm_contracts.scheduler_config import admission_flags
from engine_pod.cli.budget import resolve_budget
from engine_pod.cli.common import (
    CliError,
    add_decoding_args,
    add_model_args,
    check_logit_args,
    group_place,
    logit_flags,
)
from engine_pod.cli.scheduling import scheduler_config
from engine_pod.cli.serve_settings import (
    data_dir_of,
    gateway_settings,
    queue_settings,
    warn_if_exposed,
)
from engine_pod.cli.sparse_args import add_sparse_args, sparse_flags
from engine_pod.cli.warm_prefix import check_warm_family, warm_prefix_flags, warm_texts
from engine_pod.cli.worker import add_worker_args
from engine_pod.cpu_threads import choose_threads

logger = logging.getLogger(__name__)
SERVE_RESERVE = 1  # CPUs the worker's default thread count leaves to the gateway, Redis and the clients

_HELD: list = []  # the data directory's lock file, open for the life of this process


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-style API on this machine (Redis + gateway + one worker)",
        description="Start a private redis-server, the gateway and one BlockServe worker on the model "
        "(default: the shipped model), print the API URL, and serve until Ctrl-C.",
        epilog="Every gateway setting is read from the same DLLM_* environment variables as `python -m "
        "gateway` reads (DLLM_API_KEYS, DLLM_API_KEYS_FILE, DLLM_MAX_QUEUED, DLLM_MAX_BODY_BYTES, "
        "DLLM_UNKNOWN_FIELDS, DLLM_REQUEST_TIMEOUT_S, ...: docs/api.md lists them); the flags above override "
        "them. Ctrl-C or SIGTERM drains: the gateway gives open requests $DLLM_DRAIN_TIMEOUT_S (default 30 s; "
        "a 503 for those not done then), the worker finishes its work within --drain-timeout; batches wait in "
        "Redis for the next start (a second Ctrl-C: at once). The gateway re-reads its API keys "
        "file when it changes, and on SIGHUP. Serving beyond loopback (--host 0.0.0.0) without keys is warned about. Extra body "
        f"fields set the settings a model family adds ({', '.join(FAMILY_SETTINGS)}; one capped by the "
        "steps per block up to --steps-per-block; unset ones: the checkpoint's; the official client sends "
        "them in extra_body); a model of another family refuses them (docs/api.md).",
    )
    add_model_args(parser)
    parser.add_argument("--host", default="127.0.0.1", help="gateway address (default: 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="gateway port (default: 8000; 0: a free port, named in the line that says the API is up)",
    )
    parser.add_argument("--service", help="queue name (default: $DLLM_SERVICE, or default)")
    parser.add_argument(
        "--model-name",
        help="model id clients pass (default: $DLLM_MODEL_NAME, or the model directory's name)",
    )
    parser.add_argument(
        "--redis-url",
        help="use this Redis instead of starting one (redis://..., or redis+cluster://NODE:PORT for a Redis "
        "Cluster; default: $DLLM_REDIS_URL, else a private redis-server)",
    )
    parser.add_argument(
        "--data-dir",
        help="where the private Redis keeps its append-only file and the gateway its files (files/; "
        "DLLM_FILE_STORE overrides) (default: $XDG_CACHE_HOME/dllm/serve/SERVICE, or ~/.cache/dllm/serve/SERVICE)",
    )
    parser.add_argument(
        "--api-keys-file",
        help="require a bearer key from this file, one key a line with its limits if any (KEY rpm=60 "
        "tpm=100000 concurrency=8 priority=high: docs/api.md), re-read when it changes and on SIGHUP "
        "(default: $DLLM_API_KEYS_FILE; $DLLM_API_KEYS takes keys separated by commas)",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        help="require this bearer key (repeatable). Discouraged: any user can read it in `ps`; "
        "use $DLLM_API_KEYS or --api-keys-file",
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="print a line per HTTP request (default: off, unless $DLLM_ACCESS_LOG is true)",
    )
    parser.add_argument(
        "--max-queued",
        type=int,
        help="queue depth that answers 429 (default: $DLLM_MAX_QUEUED, or 10000)",
    )
    parser.add_argument(
        "--max-tokens-limit",
        type=int,
        help="largest max_tokens accepted (default: $DLLM_MAX_TOKENS, or 512)",
    )
    parser.add_argument(
        "--gateway-processes",
        type=int,
        help="gateway processes sharing the port, one core each (default: $DLLM_GATEWAY_PROCESSES, or 1)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="worker /metrics, /healthz, /readyz port (default: any free)",
    )
    parser.add_argument(
        "--on-model-change",
        choices=ON_MODEL_CHANGE,
        default="refuse",
        help="when the queue (the data directory's, or --redis-url's) holds work accepted for another model: "
        "refuse to start, saying what waits (default), or fail: start, and that work ends with an error",
    )
    parser.add_argument(
        "--exit-when-drained",
        action="store_true",
        help="stop (status 0) once no accepted work waits: serve what a queue holds, then change the model",
    )
    add_worker_args(parser)
    add_decoding_args(parser)
    add_sparse_args(parser)
    parser.set_defaults(handler=run)


def _worker_args(args: argparse.Namespace, redis_url: str, identity: ModelIdentity) -> list[str]:
    """The ``dllm worker`` command line that runs what ``args`` asked ``dllm serve`` for."""
    budget = ["--profile", args.profile] if args.profile else ["--token-budget", str(resolve_budget(args))]
    decoding = [
        *("--block-length", str(args.block_length), "--remasking", args.remasking),
        *("--threshold", str(args.threshold), "--cache", args.cache, "--canvas", args.canvas),
        *(["--ignore-eos"] if args.ignore_eos else []),
        *("--prefix-cache", "on" if args.prefix_cache[0] else "off"),
        *logit_flags(args),
        *(["--batch-invariant", "on"] if args.batch_invariant[0] else []),
        *sparse_flags(args),
    ]
    return [
        *("--model", args.model, "--device", args.device, "--dtype", args.dtype),
        *(["--family", args.family] if args.family else []),  # the worker refuses a checkpoint of another
        *(
            ["--threads", args.threads]
            if args.threads is not None
            else ["--threads-reserve", str(SERVE_RESERVE)]
        ),
        *("--redis", redis_url, "--service", args.service, *budget),
        *admission_flags(scheduler_config(args)),
        *("--policy", args.policy, "--batch-size", str(args.batch_size)),
        *("--steps-per-block", str(args.steps_per_block)),
        *("--lease-ms", str(args.lease_ms), "--drain-timeout", str(args.drain_timeout)),
        *("--result-ttl", str(args.result_ttl), "--model-identity", identity.text),
        *("--tensor-parallel", str(args.tensor_parallel), "--expert-parallel", str(args.expert_parallel)),
        *warm_prefix_flags(args),
        *decoding,
    ]


def _served_model_dir(args: argparse.Namespace) -> Path:
    """The directory the gateway reads the tokenizer (and EOS ids) from: the model's own, or for a random
    model its preset's config beside the shipped tokenizer (under the data directory)."""
    from dllm_contracts.model_source import resolve_model_dir
    from engine_pod.serve.random_model import random_model_dir

    if not args.model.startswith("random:"):
        return resolve_model_dir(args.model)
    return random_model_dir(args.model, data_dir_of(args) / "random-models")


def run(args: argparse.Namespace) -> int:
    from engine_pod.serve.gateway_process import GatewayProcess
    from engine_pod.serve.preflight import PreflightError
    from engine_pod.serve.queue_owner import QueueHeldError, QueueOwner, QueueUnreachable
    from engine_pod.serve.stopping import Stopping
    from engine_pod.serve.supervisor import ChildCannotStart, Supervised, Supervisor, child_popen_options
    from engine_pod.serve.worker_process import WorkerProcess
    from gateway.api_keys import keys_state

    check_logit_args(args)
    check_warm_family(args)  # refused here, before anything starts
    warm_texts(args)  # a file that cannot be read, too
    _quiet_terminal()
    # a bad count ends serve here, before anything starts; the default keeps a CPU for the gateway and Redis
    # (and the worker, choosing it so as well, follows the load from there)
    threads = choose_threads(args.threads, reserve=SERVE_RESERVE)
    args.threads = None if threads.follow else str(threads.threads)  # a pinned count: the worker's too
    queue_settings(args)
    scheduler_config(args)  # a bad flag, or a profile of another layout or parallel size, ends serve here
    _check_group(args)  # a group the model cannot be spread over, or that cannot fit, too
    sparse_flags(args)  # bad head-sparse settings end serve here too
    model_dir = _served_model_dir(args)
    if not (model_dir / "tokenizer.json").is_file():
        raise CliError(f"{model_dir} has no tokenizer.json; the gateway needs one")
    settings = gateway_settings(args, model_dir)
    warn_if_exposed(args.host, settings)
    try:
        redis, redis_url, where = _redis(args)
    except PreflightError as exc:
        raise CliError(str(exc)) from None
    identity = ModelIdentity.of(settings.served_model, model_dir)
    options = child_popen_options()
    children = [Supervised("redis-server", redis)] if redis is not None else []
    worker = WorkerProcess(
        _worker_args(args, redis_url, identity),
        args.metrics_port,  # None: one picked (and picked again if taken before the worker binds it)
        options,
        stop_s=args.drain_timeout + 10,
        model=f"{settings.served_model} on {args.device}, {args.dtype}",
    )
    gateway_env = replace(settings, redis_url=redis_url, model_identity=identity.text).to_env()
    stop_s = settings.stop_within_s
    log_level = "info" if settings.access_log else "warning"  # the access log is uvicorn's info
    gateway = GatewayProcess(args.host, args.port, gateway_env, options, stop_s=stop_s, log_level=log_level)
    children += [Supervised("worker", worker, drains=True), Supervised("gateway", gateway, drains=True)]
    supervisor = Supervisor(children)
    if redis is not None:
        redis.interrupted = supervisor.stopping  # Ctrl-C while Redis loads its data stops the wait
    private = redis is not None
    stopping = Stopping(supervisor, redis_url, args.service, where, private)
    stopping.install()
    signal.signal(signal.SIGHUP, lambda *_: gateway.signal(signal.SIGHUP))  # the gateway re-reads its keys
    logger.info("worker's %s", threads.log_line())
    served = ServedRecord(identity, portable_name(args.model))
    owner = QueueOwner(redis_url, args.service, served, where, private)
    try:
        supervisor.start_all(before={"worker": lambda: owner.bind(args.on_model_change, supervisor.stopping)})
    except (ChildCannotStart, QueueHeldError, QueueUnreachable) as exc:
        raise CliError(str(exc)) from None
    if args.exit_when_drained:
        owner.stop_when_drained(supervisor)
    if not supervisor.stopping.is_set():
        name = settings.served_model
        sys.stdout.write(
            f"dllm serve: OpenAI-compatible API at {gateway.url}/v1 (model {name}, "
            f"{keys_state(settings)}); Ctrl-C stops\n"
        )
        sys.stdout.flush()
    try:
        supervisor.watch()
    finally:
        supervisor.stop_all(stopping.waiting)
    return stopping.farewell()


def _check_group(args: argparse.Namespace) -> None:
    """The worker's group (``--tensor-parallel``, ``--expert-parallel``) checked against the model and this
    machine's memory before anything starts (the worker checks again before its ranks start)."""
    if (place := group_place(args)).size > 1:
        from engine_pod.group_processes import ModelArgs, check_group  # torch: only for a group

        check_group(place, ModelArgs(args.model, args.device, args.dtype, family=args.family))


def _redis(args: argparse.Namespace):
    """The private Redis to start (None when ``--redis-url`` names one), its URL, and where accepted work
    is kept. Every port and the data directory are checked here, before anything starts."""
    from engine_pod.serve.preflight import check_data_dir, check_port_free, hold_data_dir, reserve_port
    from engine_pod.serve.redis_server import RedisServer
    from engine_pod.serve.supervisor import child_popen_options

    reserved = reserve_port(args.host, args.port, "the gateway", "--port")
    _HELD.append(reserved)  # the gateway's port, held from here until this process ends
    args.port = reserved.getsockname()[1]  # --port 0: the free port the kernel chose
    if args.metrics_port:
        check_port_free("127.0.0.1", args.metrics_port, "the worker's probe server", "--metrics-port")
    if args.redis_url:
        return None, args.redis_url, args.redis_url
    data_dir = check_data_dir(data_dir_of(args))
    _HELD.append(hold_data_dir(data_dir))  # kept until this process ends
    redis = RedisServer(data_dir=str(data_dir), appendonly=True, popen_options=child_popen_options())
    return redis, redis.url, str(data_dir)


def _quiet_terminal() -> None:
    """One line per stage: times and messages, not every health poll of the children."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
