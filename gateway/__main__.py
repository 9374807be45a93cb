"""``python -m gateway``: run the gateway with settings from the environment (the container's command)."""

from __future__ import annotations

import argparse
import copy
import errno
import logging
import sys

import uvicorn

from gateway.api_keys import exposure_warning, keys_state
from gateway.app import build_app
from gateway.head_limits import guarded
from gateway.processes import (
    CHILD_FLAG,
    SUPERVISED_FLAG,
    exclusive_socket,
    port_is_free,
    run_processes,
    shared_socket,
)
from gateway.settings import GatewaySettings, SettingsError, env_help
from gateway.tokenizer import TokenizerError

logger = logging.getLogger("gateway")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway",
        description="dllm's OpenAI-style gateway: it queues requests in Redis for the service's workers\n"
        "and answers with their results. Its settings come from the environment (below).",
        epilog=env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info", help="(default: info)"
    )
    parser.add_argument(CHILD_FLAG, type=int, default=None, help=argparse.SUPPRESS)
    # started by dllm serve, which has said whether keys are on (and warned) on its own terminal line
    parser.add_argument(SUPERVISED_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    child = args.process_index
    level = args.log_level.upper()
    tag = "" if child is None else f"[{child}] "  # which of several processes says it
    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s")
    logging.getLogger("gateway.api_keys").setLevel(logging.INFO)  # key reloads are said at every level
    try:
        settings = GatewaySettings.from_env()
        if child is None and not args.supervised:
            _say_keys(settings, args.host)
        if child is None and settings.processes > 1:
            return _supervise(settings.processes, args, argv)
        app = build_app(settings, metrics_server=not child)
    except (SettingsError, TokenizerError, ValueError) as exc:
        sys.stderr.write(f"gateway: error: {exc}\n")
        return 2
    # one of several on the port, or on dllm serve's held port: a socket of the group; else the port alone
    listen = shared_socket if child is not None or args.supervised else exclusive_socket
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        sys.stderr.write(f"gateway: error: {_port_error(args, exc)}\n")
        return 2
    _server(app, settings, args, tag).run(sockets=[sock])
    return 0


def _port_error(args: argparse.Namespace, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {args.port} is in use"
    return f"cannot listen on {args.host}:{args.port}: {exc.strerror}"


def _say_keys(settings: GatewaySettings, host: str) -> None:
    """Whether keys are on, and a warning when the API is open to other machines."""
    logger.info("%s", keys_state(settings))
    warning = exposure_warning(host, settings)
    if warning:
        logger.warning(warning)


def _supervise(count: int, args: argparse.Namespace, argv: list[str] | None) -> int:
    if not args.supervised and not port_is_free(args.host, args.port):  # dllm serve holds its port for us
        sys.stderr.write(f"gateway: error: port {args.port} is in use\n")  # as _port_error says it
        return 2
    return run_processes(count, list(sys.argv[1:] if argv is None else argv))


def _log_config(tag: str) -> dict:
    """uvicorn's logging, each line tagged with the process it comes from (several processes)."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    for formatter in config["formatters"].values():
        formatter["fmt"] = formatter["fmt"].replace("%(levelprefix)s ", f"%(levelprefix)s {tag}", 1)
    return config


def _server(app, settings: GatewaySettings, args: argparse.Namespace, tag: str) -> DrainingServer:
    return gateway_server(app, settings, args.host, args.port, args.log_level, tag)


def gateway_server(
    app, settings: GatewaySettings, host: str, port: int, log_level: str = "info", tag: str = ""
) -> DrainingServer:
    """Uvicorn serving the gateway's ``app`` as ``python -m gateway`` does: stock uvicorn (its httptools
    protocol) under the gateway's limits on a request's head, the client's address from trusted proxies,
    the gateway's logging, a drain as long as the settings say."""
    config = uvicorn.Config(
        app,
        log_config=_log_config(tag),
        host=host,
        port=port,
        log_level=log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=max(int(settings.drain_timeout_s), 1),
        proxy_headers=True,
        forwarded_allow_ips=list(settings.forwarded_allow_ips),
    )
    config.load()  # uvicorn's choice of protocol, then wrapped in the head limits
    config.http_protocol_class = guarded(config.http_protocol_class, settings, app)
    return DrainingServer(config, app)


class DrainingServer(uvicorn.Server):
    """Uvicorn that, on SIGTERM or Ctrl-C, tells open requests to end in time for their clients to hear."""

    def __init__(self, config: uvicorn.Config, app) -> None:
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig, frame) -> None:
        gateway = getattr(self.app.state, "gateway", None)
        if gateway is not None:
            gateway.shutting_down()
        super().handle_exit(sig, frame)


if __name__ == "__main__":
    sys.exit(main())
