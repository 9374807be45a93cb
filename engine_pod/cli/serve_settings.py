"""What ``dllm serve`` tells its children: the queue's service and Redis, and the gateway's settings
(the ``DLLM_*`` environment the gateway reads, then the command's flags over it)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from engine_pod.cli.common import CliError

logger = logging.getLogger(__name__)


def default_data_dir(service: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "dllm" / "serve" / service


def data_dir_of(args: argparse.Namespace) -> Path:
    """Where serve keeps its Redis's data, its files (uploads, batch outputs) and random models."""
    return Path(args.data_dir).expanduser() if args.data_dir else default_data_dir(args.service)


def gateway_settings(args: argparse.Namespace, model_dir: Path):
    """The gateway's settings: the ``DLLM_*`` environment the gateway itself reads, then this command's
    flags over it; what the worker decides (its decoding, its queue) is the worker's. The Redis URL is
    set once Redis runs."""
    from dllm_contracts.model_source import default_served_name
    from gateway.settings import GatewaySettings, SettingsError, env_values

    flags = {
        "api_keys": tuple(args.api_key) if args.api_key else None,
        "api_keys_file": str(Path(args.api_keys_file).resolve()) if args.api_keys_file else None,
        "max_queued": args.max_queued,
        "max_tokens_limit": args.max_tokens_limit,
        "model_name": args.model_name,
        "access_log": True if args.access_log else None,
        "processes": args.gateway_processes,
    }
    values = env_values() | {name: value for name, value in flags.items() if value is not None}
    values.setdefault("model_name", default_served_name(args.model, model_dir))
    values.setdefault("file_store", str(data_dir_of(args) / "files"))  # beside the queue's Redis data
    values.setdefault("access_log", False)  # a line per request would bury the terminal's own lines
    limit = values.get("max_tokens_limit", GatewaySettings.max_tokens_limit)
    values.setdefault("default_max_tokens", min(GatewaySettings.default_max_tokens, limit))
    values |= {
        "service": args.service,
        "model_dir": str(model_dir),
        "block_length": args.block_length,
        "steps_per_block": args.steps_per_block,
        "threshold": args.threshold,
        "result_ttl_s": args.result_ttl,
    }
    values.setdefault("context_length", served_context(args, model_dir))
    try:
        settings = GatewaySettings(**values)
        check_keys(settings)
    except SettingsError as exc:
        raise CliError(str(exc)) from None
    return settings


def served_context(args: argparse.Namespace, model_dir: Path) -> int:
    """The context the gateway holds requests to: the model's, or less where the worker's token budget
    cannot hold a request that long (a prompt and max_tokens rounded up to blocks, the budget's measure of
    a row at its widest); 0: the model's own (the gateway reads it)."""
    from dllm_contracts.model_context import context_length_of
    from engine_pod.cli.budget import resolve_budget
    from gateway.model_files import model_files
    from gateway.prompt_limits import FALLBACK_CONTEXT

    model = context_length_of(model_files(str(model_dir)).config) or FALLBACK_CONTEXT
    held = resolve_budget(args) - args.block_length + 1
    if held >= model:
        return 0
    logger.info(
        "requests are held to %d tokens (prompt and max_tokens): the token budget's, below the model's "
        "context of %d",
        max(held, 1),
        model,
    )
    return max(held, 1)


def check_keys(settings) -> None:
    """A keys file that cannot be read ends ``dllm serve`` here, before the model loads."""
    from gateway.api_keys import ApiKeys

    ApiKeys(settings)


def queue_settings(args: argparse.Namespace) -> None:
    """The service and Redis URL from the flags, else the environment the gateway reads."""
    from gateway.settings import env_values

    env = env_values()
    args.service = args.service or env.get("service", "default")
    args.redis_url = args.redis_url or env.get("redis_url")


def warn_if_exposed(host: str, settings) -> None:
    from gateway.api_keys import exposure_warning

    warning = exposure_warning(host, settings)
    if warning:
        logger.warning("warning: %s", warning)
