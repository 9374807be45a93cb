"""Environment variables that the operator sets on engine pods and every ``dllm`` engine command reads."""

from __future__ import annotations

THREADS_ENV = "DLLM_THREADS"  # torch's intra-op threads; the operator sets it from the pod's CPU request
