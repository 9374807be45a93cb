"""Operator tests run the real Kopf operator with a one-second resync against an emulated API server:
the ``cluster`` (kmock over HTTP) and the ``operator`` (Kopf, in a thread) fixtures."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DLLM_OPERATOR_RESYNC_S", "1")

from kopf.testing import KopfRunner  # noqa: E402

from tests.operator.cluster import EmulatedCluster  # noqa: E402


@pytest.fixture
def cluster():
    with EmulatedCluster() as emulated:
        yield emulated


@pytest.fixture
def operator(cluster, monkeypatch):
    """The operator, with the environment as the test left it before asking for this fixture."""
    from dllm_operator import handlers

    monkeypatch.setenv("DLLM_K8S_API_URL", cluster.url)
    handlers.reset()
    with KopfRunner(["run", "--standalone", "--all-namespaces", "-m", "dllm_operator"], timeout=60) as runner:
        yield runner
    handlers.reset()
    # the operator itself ran and stopped cleanly (a crash in it would otherwise pass unseen)
    assert runner.exception is None, runner.exception
    assert runner.exit_code == 0, runner.output[-3000:]
    # and no handler failed (Kopf logs and retries those; a reconcile must end with a status, not a traceback)
    assert "Traceback" not in runner.output, runner.output[-3000:]
