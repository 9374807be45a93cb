"""Schema-driven fuzzing of the gateway's OpenAPI document: no input produces a 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.serving.conftest import WorkerThread  # noqa: F401 (fixture plumbing)
from tests.serving_utils import GatewayServer, gateway_settings


@pytest.fixture
def api_schema(served_model, redis_server, service, make_worker):
    settings_ = gateway_settings(served_model, redis_server.url, service, request_timeout_s=60)
    with GatewayServer(settings_) as gateway, make_worker(redis_server.url, service):
        yield schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_makes_the_gateway_fail(case):
    response = case.call(timeout=120)
    assert response.status_code < 500, (
        f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    )
