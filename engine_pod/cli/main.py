"""The ``dllm`` command: one subcommand per job; bad input ends with one line and exit status 2."""

from __future__ import annotations

import argparse
import logging
import sys

if __name__ == "__main__":  # python -m engine_pod.cli.main: restart under huge pages before torch loads
    from engine_pod.cli.huge_pages import restart_with_huge_pages

    restart_with_huge_pages(["-m", "engine_pod.cli.main", *sys.argv[1:]])

from dllm_contracts.families import FAMILIES_IN_WORDS
from engine_pod.allocators import configure_cuda_allocator, tune_cpu_allocator
from engine_pod.cli import bench, census, eval, generate, heads, profile, serve, train, worker

_COMMANDS = [generate, serve, bench, eval, profile, heads, train, worker, census]


class _DefaultsShown(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it says it already (or has none)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default in (None, False, argparse.SUPPRESS) or not action.option_strings
        return text if unset or "default" in text else f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _DefaultsShown)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dllm",
        description=f"Serve diffusion LLMs ({FAMILIES_IN_WORDS}) with block-granularity continuous batching. "
        "`dllm serve` runs the whole service on this machine; `dllm COMMAND --help` explains each command.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for command in _COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_cuda_allocator()  # before CUDA starts: the profiler and the engine must share one allocator
    tune_cpu_allocator()  # CPU peaks then follow the batch shape, as the profiled budget assumes
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, OSError) as exc:
        sys.stderr.write(f"dllm {args.command}: error: {exc}\n")
        return 2
    except ImportError as exc:  # the engine installed alone: no serving stack
        sys.stderr.write(
            f"dllm {args.command}: error: {exc}; this command needs the serving stack "
            "(pip install 'dllm-serve[serve]')\n"
        )
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"dllm {args.command}: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
