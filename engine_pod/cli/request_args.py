"""The flags of one request's own settings (``dllm generate``): its seed and the settings model families
add (declared once, in dllm_contracts/request_params.py)."""

from __future__ import annotations

import argparse

from dllm_contracts.request_params import FAMILY_SETTINGS, RequestParams
from dllm_contracts.request_setting import SettingError
from engine_pod.cli.common import CliError

# the settings model families add, as flags; one capped by a decoding setting is set by that setting's flag
# (DiffusionGemma's max_denoising_steps: --steps-per-block)
FAMILY_FLAGS = tuple(name for name, declared in FAMILY_SETTINGS.items() if declared.ceiling is None)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_request_args(parser: argparse.ArgumentParser) -> None:
    """The request's own settings: its seed and the settings model families add (a family that adds
    none refuses them; unset ones: the checkpoint's)."""
    group = parser.add_argument_group("the request's settings (a model family's: default, the checkpoint's)")
    group.add_argument(
        "--seed", type=int, default=0, help="seed of the request's draws (DiffusionGemma's noise; default: 0)"
    )
    for name in FAMILY_FLAGS:
        declared = FAMILY_SETTINGS[name]
        group.add_argument(flag(name), type=declared.kind, help=declared.description)


def request_params(args: argparse.Namespace) -> RequestParams:
    """The request ``add_request_args``' flags set (its max_tokens: the command's)."""
    family = {name: getattr(args, name) for name in FAMILY_FLAGS if getattr(args, name) is not None}
    try:
        return RequestParams(seed=args.seed, family=family)
    except SettingError as error:
        raise CliError(f"{flag(error.param)}: {error}") from None
