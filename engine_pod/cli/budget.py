"""``--token-budget N`` or ``--profile FILE``: where every engine command gets its token budget."""

from __future__ import annotations

import argparse

from dllm_contracts.defaults import DEFAULT_TOKEN_BUDGET
from dllm_contracts.profile_summary import ProfileFormatError, ProfileSummary, read_profile_file
from engine_pod.cli.common import CliError


def add_budget_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--token-budget", type=int, help=f"BlockServe token budget (default: {DEFAULT_TOKEN_BUDGET})"
    )
    group.add_argument("--profile", help="JSON written by `dllm profile`; its token_budget is used")


def read_profile(path: str) -> ProfileSummary:
    try:
        return read_profile_file(path)
    except ProfileFormatError as exc:
        raise CliError(str(exc)) from exc


def resolve_budget(args: argparse.Namespace) -> int:
    if args.profile:
        return read_profile(args.profile).token_budget
    budget = args.token_budget if args.token_budget is not None else DEFAULT_TOKEN_BUDGET
    if budget < 1:
        raise CliError(f"--token-budget must be positive, got {budget}")
    return budget
