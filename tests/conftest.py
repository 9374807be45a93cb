"""Shared pytest setup: single-threaded torch (tiny models are faster so, and CI has two cores)."""

from __future__ import annotations

import os
import sys

import torch
from hypothesis import settings

from dllm_contracts.engine_env import THREADS_ENV

torch.set_num_threads(int(os.environ.get("DLLM_TEST_THREADS", "1")))
# the dllm commands that tests run, in this process or as children, keep the same count
os.environ.setdefault(THREADS_ENV, os.environ.get("DLLM_TEST_THREADS", "1"))


# Hypothesis: CI (CI=true, as .ci/run runs) replays the same examples every run, so a red CI is
# reproducible and a green one cannot flip by luck; locally each run explores new examples.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_configure(config) -> None:
    """Compiled bytecode written and reused by the suite's processes, even where the environment says not
    to write any (``PYTHONDONTWRITEBYTECODE``, which container images often set, this machine's among
    them): otherwise each of the hundreds of ``dllm`` and gateway processes the tests start compiles the
    project's sources again, and each test process rewrites every test module's asserts again. Set here,
    in the first process (xdist's controller), so that its test processes and every child inherit it; the
    files go where Python puts them by default (``__pycache__``, which git ignores)."""
    if hasattr(config, "workerinput"):
        return
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
