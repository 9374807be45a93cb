"""``--token-budget N`` or ``--profile FILE``: where every engine command gets its token budget."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine_pod.cli.common import CliError
from engine_pod.defaults import DEFAULT_TOKEN_BUDGET


def add_budget_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--token-budget", type=int, help=f"BlockServe token budget (default: {DEFAULT_TOKEN_BUDGET})"
    )
    group.add_argument("--profile", help="JSON written by `dllm profile`; its token_budget is used")


def _read_profile(path: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise CliError(f"profile file {path} does not exist")
    try:
        result = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not a `dllm profile` result (not JSON)") from exc
    if not isinstance(result, dict) or "token_budget" not in result:
        raise CliError(f"{path} is not a `dllm profile` result (no token_budget)")
    return result


def profile_usable_memory(path: str) -> int | None:
    """The usable memory a profile planned for (bytes), if it says."""
    value = _read_profile(path).get("usable_memory_bytes")
    return value if isinstance(value, int) else None


def budget_from_profile(path: str) -> int:
    budget = _read_profile(path)["token_budget"]
    if not isinstance(budget, int) or budget < 1:
        raise CliError(f"{path} has an invalid token_budget {budget!r}")
    return budget


def resolve_budget(args: argparse.Namespace) -> int:
    if args.profile:
        return budget_from_profile(args.profile)
    budget = args.token_budget if args.token_budget is not None else DEFAULT_TOKEN_BUDGET
    if budget < 1:
        raise CliError(f"--token-budget must be positive, got {budget}")
    return budget
