"""Fixtures: a real redis-server per test, the served tiny model, an in-process worker thread."""

from __future__ import annotations

import threading
import uuid

import pytest

from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.serve.redis_server import RedisServer
from engine_pod.worker.config import WorkerConfig
from engine_pod.worker.worker import Worker
from tests.redis_cluster import LocalRedisCluster
from tests.serving.serve_process import running
from tests.serving_utils import BLOCK, write_served_model

SERVED = "tiny-llada"  # the shipped model's id
KEY, OTHER_KEY = "key-of-tenant-a", "key-of-tenant-b"  # the two tenants of ``keyed_serve``


@pytest.fixture(scope="session")
def served_model(tmp_path_factory):
    return write_served_model(tmp_path_factory.mktemp("served-model"))


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["single", "cluster"])
def single_or_cluster(request):
    """One redis-server, then a three-master Redis Cluster (``redis+cluster://`` URL), for the tests that
    check the serving path on both."""
    server = LocalRedisCluster() if request.param == "cluster" else RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def service():
    return f"t{uuid.uuid4().hex[:10]}"


class WorkerThread:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc) -> None:
        self.worker.drain()
        self.thread.join(timeout=30)


@pytest.fixture
def make_worker(served_model):
    served = load_model(str(served_model))

    def build(
        redis_url: str,
        service: str,
        token_budget: int = 2048,
        scheduling: dict | None = None,
        worker: dict | None = None,
        model_dir=None,
        **decoding,
    ) -> WorkerThread:
        """A worker (not started) on the served model, or on the checkpoint in ``model_dir``."""
        loaded = served if model_dir is None else load_model(str(model_dir))
        config = DecodingConfig(block_length=BLOCK, steps_per_block=BLOCK, **decoding)
        settings = SchedulerConfig(token_budget, **(scheduling or {}))
        worker_config = WorkerConfig(redis_url, service, settings, **({"lease_ms": 3000} | (worker or {})))
        return WorkerThread(Worker(make_runner(loaded, config), worker_config))

    return build


@pytest.fixture(scope="session")
def keyed_serve(tmp_path_factory):
    """One ``dllm serve`` of the shipped model for the API's conformance tests, keys turned on as README
    shows (``DLLM_API_KEYS=... dllm serve``): two tenants. Tests share it and stop nothing."""
    with running(tmp_path_factory.mktemp("keyed"), env={"DLLM_API_KEYS": f"{KEY},{OTHER_KEY}"}) as server:
        yield server
