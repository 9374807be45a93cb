"""Shared pytest setup: single-threaded torch (tiny models are faster so, and CI has two cores)."""

from __future__ import annotations

import os

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
