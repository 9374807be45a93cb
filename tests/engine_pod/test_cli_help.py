"""``dllm --help`` and every ``dllm COMMAND --help`` answer without loading torch (only what runs a model
imports it), and say what the built-in models are and every default."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dllm_contracts.request_params import FAMILY_SETTINGS

COMMANDS = ["", "serve", "worker", "generate", "bench", "eval", "profile", "train"]
HEAVY = ("torch", "transformers", "redis", "fastapi", "kopf")


def _help(command: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-X", "importtime", "-m", "engine_pod.cli.main", *command.split(), "--help"]
    env = os.environ | {"DLLM_NO_HUGE_PAGES": "1"}  # the process itself, not a re-executed child
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=True)


def _imported(importtime_log: str) -> set[str]:
    """Top-level packages named in ``-X importtime``'s log."""
    names = (line.rsplit("|", 1)[-1].strip() for line in importtime_log.splitlines() if "|" in line)
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c or "dllm")
def test_help_imports_no_torch_and_no_serving_stack(command):
    done = _help(command)
    assert "usage: dllm" in done.stdout
    assert not _imported(done.stderr) & set(HEAVY), sorted(_imported(done.stderr) & set(HEAVY))


def test_help_names_the_built_in_models_and_the_defaults():
    text = " ".join(_help("serve").stdout.split("options:", 1)[1].split())
    assert "builtin:tiny-llada" in text and "random:llada-8b" in text and "random:dream-7b" in text
    for option in ("--drain-timeout DRAIN_TIMEOUT", "--lease-ms LEASE_MS", "--token-budget TOKEN_BUDGET"):
        assert "default" in text.split(option, 1)[1].split(" --", 1)[0], option
    assert all(name in text for name in FAMILY_SETTINGS)  # the request fields model families add


def test_help_names_every_family():
    """``dllm --help`` and ``--model``'s help (every command that loads a model shares it)."""
    from dllm_contracts.families import FAMILY_NAMES

    top = " ".join(_help("").stdout.split())
    model = " ".join(_help("generate").stdout.rsplit("--model MODEL", 1)[1].split("--device", 1)[0].split())
    for text in (top, model):
        missing = [name for name in FAMILY_NAMES.values() if name not in text]
        assert not missing, f"{text[:80]!r}... lacks {missing}"
