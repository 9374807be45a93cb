"""The worker's HTTP endpoints, served from before the model loads: /healthz (the process is alive),
/startupz (the model is loaded: Kubernetes' startupProbe and ``dllm serve`` wait on it), /readyz
(serving: loaded and Redis reachable) and /metrics (Prometheus)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


@dataclass
class ProbeSource:
    """What the endpoints report. Empty while the model loads; ``attach`` the worker once it exists."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    ready: Callable[[], bool] | None = None

    @property
    def started(self) -> bool:
        return self.ready is not None

    def attach(self, registry: CollectorRegistry, ready: Callable[[], bool]) -> None:
        self.registry, self.ready = registry, ready


def serve_probes(host: str, port: int, source: ProbeSource) -> ThreadingHTTPServer:
    """Start the endpoints in a daemon thread; ``server.shutdown()`` stops them."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/metrics":
                self._reply(200, generate_latest(source.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._reply(200, b"ok\n", "text/plain")
            elif self.path == "/startupz":
                ok = source.started
                self._reply(200 if ok else 503, b"started\n" if ok else b"loading the model\n", "text/plain")
            elif self.path == "/readyz":
                ok = source.ready is not None and source.ready()
                self._reply(200 if ok else 503, b"ready\n" if ok else b"not ready\n", "text/plain")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (keep access logs out of stderr)
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="worker-http", daemon=True).start()
    return server
