"""``dllm bench --url`` against a server that is not there or answers with an error: one line, exit 2, no
traceback (the 401 of a server with keys: tests/serving/test_serve_settings.py)."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading

from engine_pod.serve.redis_server import free_port


def _bench(url: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "engine_pod.cli.main", "bench", "--url", url, "--concurrency", "1"]
    return subprocess.run([*argv, "--requests", "1"], capture_output=True, text=True, timeout=300)


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dllm bench: error: "), done.stderr
    return lines[0]


def test_nothing_listening_is_one_line():
    url = f"http://127.0.0.1:{free_port()}"
    assert f"cannot reach {url}: " in _one_line(_bench(url))


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the handler's name is the library's)
        body = b'{"error": {"message": "Not Found", "type": "invalid_request_error", "code": null}}'
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_server_without_the_api_is_one_line():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert _one_line(_bench(url)) == f"dllm bench: error: {url}/v1/models: HTTP 404: Not Found"
    finally:
        server.shutdown()
        server.server_close()
