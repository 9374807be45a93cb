"""Operator tests run the real Kopf operator with a one-second resync against an emulated API server."""

from __future__ import annotations

import os

os.environ.setdefault("DLLM_OPERATOR_RESYNC_S", "1")
