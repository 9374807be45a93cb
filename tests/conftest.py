"""Shared pytest setup: single-threaded torch (tiny models are faster so, and CI has two cores)."""

from __future__ import annotations

import os

import torch

torch.set_num_threads(int(os.environ.get("DLLM_TEST_THREADS", "1")))
