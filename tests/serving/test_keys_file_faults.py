"""A keys file with content the gateway cannot use, on the product path: two ``python -m gateway`` processes
against one redis-server, the keys file laid out as a Kubernetes Secret's volume and re-read every
``RELOAD_S``. A wrong line or byte keeps the keys loaded before and is logged with its file and line; the
watcher goes on, so a key revoked afterwards stops working at the next reload. At start, the same content
ends the gateway with one line that names the line."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from engine_pod.serve.gateway_process import GatewayProcess
from engine_pod.serve.redis_server import free_port
from tests.serving.secret_volume import SecretVolume
from tests.serving_utils import WAIT_S, GatewayServer, gateway_settings, wait_for

RELOAD_S = 2.0  # how often the gateways look at the keys file
WITHIN_S = 15 * RELOAD_S  # the bound on a reload's effect (one period on an idle machine; see the report)
GOOD = "key-a\nkey-b\n"
UNUSABLE = {
    # a comment saved as Latin-1: "é" is the byte 0xE9, not UTF-8
    "latin1-byte": (b"key-a\n# caf\xe9 team\nkey-b\n", "line 2", "not UTF-8"),
    # Python calls "²" a digit, int() does not take it
    "superscript-digit": ("key-a\nkey-b rpm=\u00b2\n".encode(), "line 2", "rpm="),
}


@pytest.fixture
def volume(tmp_path):
    root = tmp_path / "secret"
    root.mkdir()
    return SecretVolume(root)


@pytest.fixture
def gateways(served_model, redis_server, service, volume, tmp_path):
    """Two gateways on the keys file (written first with ``GOOD``), each logging to its own file."""
    volume.write(GOOD)
    env = gateway_settings(served_model, redis_server.url, service).to_env()
    env |= {"DLLM_API_KEYS_FILE": str(volume.path), "DLLM_API_KEYS_RELOAD_S": str(RELOAD_S)}
    started, logs = [], []
    try:
        for index in range(2):
            log = tmp_path / f"gateway-{index}.log"
            sink = open(log, "wb")  # noqa: SIM115 (closed below)
            logs.append((log, sink))
            options = {"stdout": sink, "stderr": subprocess.STDOUT}
            started.append(GatewayProcess("127.0.0.1", free_port(), env, popen_options=options).start())
        yield list(zip(started, (log for log, _ in logs), strict=True))
    finally:
        for gateway in started:
            gateway.stop()
        for _, sink in logs:
            sink.close()


def _status(gateway: GatewayProcess, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{gateway.url}/v1/models", headers=headers, timeout=WAIT_S).status_code


@pytest.mark.parametrize("case", UNUSABLE)
def test_a_key_revoked_after_an_unusable_keys_file_stops_at_the_next_reload(gateways, volume, case):
    content, line, what = UNUSABLE[case]
    where = f"{volume.path}, {line}:"
    assert all(_status(g, "key-b") == 200 for g, _ in gateways)
    volume.write(content)
    for gateway, log in gateways:
        refused = wait_for(
            lambda log=log: [x for x in log.read_text(errors="replace").splitlines() if where in x],
            WITHIN_S,
            0.1,
            what=f"the keys file's {line} to be logged",
            seen=lambda log=log: log.read_text(errors="replace")[-2000:],
        )
        assert what in refused[0], refused
        assert "Traceback" not in log.read_text(errors="replace")
        # the keys loaded before are kept, the gateway stays ready
        assert (_status(gateway, "key-a"), _status(gateway, "key-b")) == (200, 200)
        assert httpx.get(f"{gateway.url}/readyz", timeout=WAIT_S).status_code == 200
    volume.write("key-a\n")  # key-b revoked
    revoked_at = time.monotonic()
    for gateway, log in gateways:
        wait_for(lambda g=gateway: _status(g, "key-b") == 401, WITHIN_S, 0.05, what="key-b revoked")
        print(f"{case}: key-b refused {time.monotonic() - revoked_at:.2f} s after its revocation")
        assert _status(gateway, "key-a") == 200
        said = log.read_text(errors="replace")
        assert "key-b" not in said  # lines are named, never the keys on them
        assert len([x for x in said.splitlines() if where in x]) == 1  # once, not at every look


def _start(keys_path, served_model, redis_url: str, service: str) -> subprocess.CompletedProcess:
    env = gateway_settings(served_model, redis_url, service).to_env() | {"DLLM_API_KEYS_FILE": str(keys_path)}
    argv = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(free_port())]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=WAIT_S)


@pytest.mark.parametrize("case", UNUSABLE)
def test_an_unusable_keys_file_at_start_ends_the_gateway_with_one_line_naming_the_line(
    tmp_path, served_model, redis_server, service, case
):
    content, line, what = UNUSABLE[case]
    keys = tmp_path / "keys"
    keys.write_bytes(content)
    done = _start(keys, served_model, redis_server.url, service)
    assert done.returncode == 2, done.stderr
    said = done.stderr.strip().splitlines()
    errors = [x for x in said if "error" in x.lower()]
    assert len(errors) == 1 and said[-1] == errors[0], done.stderr  # one line, the last, no traceback
    assert errors[0].startswith("gateway: error: "), done.stderr
    assert f"{keys}, {line}:" in errors[0] and what in errors[0], errors
    assert "key-b" not in errors[0]


class Planted(BaseException):
    """What no ``except Exception`` catches: a watcher ended by it is one that cannot run."""


def test_a_gateway_whose_keys_file_is_no_longer_watched_says_so_on_readyz(
    tmp_path, served_model, redis_server, service
):
    keys = tmp_path / "keys"
    keys.write_text(GOOD)
    settings = gateway_settings(
        served_model, redis_server.url, service, api_keys_file=str(keys), api_keys_reload_s=0.05
    )
    with GatewayServer(settings) as server:
        assert httpx.get(f"{server.url}/readyz", timeout=WAIT_S).status_code == 200
        api_keys = server.server.config.app.state.gateway.api_keys

        def cannot_look() -> bool:
            raise Planted("planted")

        api_keys.changed = cannot_look  # the watcher's next look ends it
        reply = wait_for(
            lambda: (r := httpx.get(f"{server.url}/readyz", timeout=WAIT_S)).status_code == 503 and r,
            what="/readyz to say the keys file is not watched",
        )
        assert f"the API keys file {keys} is no longer watched" in reply.text
