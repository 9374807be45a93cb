"""The ``dllm`` command: one subcommand per job; bad input ends with one line and exit status 2."""

from __future__ import annotations

import argparse
import logging
import sys

if __name__ == "__main__":  # python -m engine_pod.cli.main: restart under huge pages before torch loads
    from engine_pod.cli.huge_pages import restart_with_huge_pages

    restart_with_huge_pages(["-m", "engine_pod.cli.main", *sys.argv[1:]])

from engine_pod.allocators import configure_cuda_allocator, tune_cpu_allocator
from engine_pod.cli import bench, eval, generate, profile, serve, train, worker

_COMMANDS = [generate, serve, bench, eval, profile, train, worker]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dllm",
        description="Serve diffusion LLMs (LLaDA, Dream) with block-granularity continuous batching.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in _COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_cuda_allocator()  # before CUDA starts: the profiler and the engine must share one allocator
    tune_cpu_allocator()  # CPU peaks then follow the batch shape, as the profiled budget assumes
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, OSError) as exc:
        sys.stderr.write(f"dllm {args.command}: error: {exc}\n")
        return 2
    except ImportError as exc:  # a bare device has the engine's libraries, not the serving stack
        sys.stderr.write(
            f"dllm {args.command}: error: {exc}; this command needs the full install (pip install -e .)\n"
        )
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"dllm {args.command}: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
