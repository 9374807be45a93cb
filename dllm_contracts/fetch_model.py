"""``python -m dllm_contracts.fetch_model MODEL [--deadline SECONDS]``: fetch a model's checkpoint into the
model cache and exit, so that the process that loads it finds it there (on Kubernetes: the init container
that runs before the engine, so the engine's startup probe covers loading only).

MODEL is whatever ``dllm serve --model`` takes; a local path is only checked. Fails in one line on stderr
(exit 1) when the model cannot be fetched or the deadline passes first (a partial download is never used)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from dllm_contracts.model_source import ModelLoadError, resolve_model_dir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dllm_contracts.fetch_model", description=__doc__)
    parser.add_argument("model", help="s3://BUCKET/PREFIX, a Hugging Face repo id (REPO@REVISION) or a path")
    parser.add_argument(
        "--deadline", type=int, default=0, help="give up after this many seconds (0: no deadline)"
    )
    return parser


def _give_up(deadline: int):
    def handler(signum, frame) -> None:
        sys.stderr.write(f"fetch_model: error: not fetched within the deadline of {deadline} s\n")
        os._exit(1)  # the download's threads stop with the process; its temporary directory is skipped

    return handler


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.deadline > 0:
        signal.signal(signal.SIGALRM, _give_up(args.deadline))
        signal.alarm(args.deadline)
    try:
        path = resolve_model_dir(args.model)
    except (ModelLoadError, ValueError, OSError) as exc:
        sys.stderr.write(f"fetch_model: error: {exc}\n")
        return 1
    logging.getLogger(__name__).info("%s is in %s", args.model, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
