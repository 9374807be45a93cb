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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = build_app(GatewaySettings.from_env())
    except (SettingsError, TokenizerError, ValueError) as exc:
        sys.stderr.write(f"gateway: error: {exc}\n")
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
