"""``python -m gateway``: run the gateway with settings from the environment (the container's command)."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from gateway.app import build_app
from gateway.settings import GatewaySettings, SettingsError
from gateway.tokenizer import TokenizerError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway", description="dllm OpenAI-style gateway (settings: DLLM_* env)"
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info", help="(default: info)"
    )
    args = parser.parse_args(argv)
    level = args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = GatewaySettings.from_env()
        app = build_app(settings)
    except (SettingsError, TokenizerError, ValueError) as exc:
        sys.stderr.write(f"gateway: error: {exc}\n")
        return 2
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=max(int(settings.drain_timeout_s), 1),
    )
    DrainingServer(config, app).run()
    return 0


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
