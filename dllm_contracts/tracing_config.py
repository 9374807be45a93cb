"""Where traces go: OpenTelemetry's standard variables, read here and nowhere else (the gateway and the
engine worker both call ``TracingConfig.from_env``). No endpoint set: no tracer at all (nothing is built,
sent or carried in the queue's payloads)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"  # the collector's base URL; traces go to <it>/v1/traces
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"  # the traces URL itself (wins over the base)
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"  # the resource's service.name (default: the component's)
SDK_DISABLED_ENV = "OTEL_SDK_DISABLED"  # "true": no traces, whatever the endpoint
TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class TracingConfig:
    traces_url: str | None  # OTLP/HTTP traces URL; None: tracing off
    service_name: str

    @property
    def enabled(self) -> bool:
        return self.traces_url is not None

    @classmethod
    def from_env(cls, default_service: str, environ: Mapping[str, str] | None = None) -> TracingConfig:
        environ = os.environ if environ is None else environ
        name = environ.get(SERVICE_NAME_ENV, "").strip() or default_service
        if environ.get(SDK_DISABLED_ENV, "").strip().lower() == "true":
            return cls(None, name)
        traces = environ.get(TRACES_ENDPOINT_ENV, "").strip()
        base = environ.get(ENDPOINT_ENV, "").strip()
        if not traces and base:
            traces = base.rstrip("/") + TRACES_PATH
        if traces and not traces.startswith(("http://", "https://")):
            variable = TRACES_ENDPOINT_ENV if environ.get(TRACES_ENDPOINT_ENV) else ENDPOINT_ENV
            raise ValueError(
                f"{variable} must be an http:// or https:// URL (OTLP over HTTP), not {traces!r}"
            )
        return cls(traces or None, name)
