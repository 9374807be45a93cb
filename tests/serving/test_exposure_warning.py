"""An API without keys on an address other machines can reach is warned about, by `dllm serve` and by
`python -m gateway`. The commands run as users run them, with `--host 0.0.0.0`, on a port this test holds
on 127.0.0.1: the warning comes before the server binds, which then fails, so nothing ever listens beyond
loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from dllm_contracts.defaults import DEFAULT_MODEL
from gateway.api_keys import exposure_warning, keys_state
from gateway.settings import GatewaySettings

WARNING = "without API keys: anyone who can reach this port can use the model"


@pytest.mark.parametrize(
    "host, warned",
    [("0.0.0.0", True), ("::", True), ("10.1.2.3", True), ("gateway.example", True)]
    + [("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False)],
)
def test_only_an_address_beyond_loopback_without_keys_is_warned_about(host, warned):
    assert (exposure_warning(host, GatewaySettings()) is not None) == warned
    assert exposure_warning(host, GatewaySettings(api_keys=("k",))) is None
    assert exposure_warning(host, GatewaySettings(api_keys_file="/keys")) is None


def test_the_keys_line_never_names_a_key():
    assert keys_state(GatewaySettings()) == "API keys off"
    assert keys_state(GatewaySettings(api_keys=("secret-key",))) == "API keys on"


def _held_port() -> socket.socket:
    """A listening socket on 127.0.0.1: binding 0.0.0.0 on its port fails."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DLLM_API_KEYS")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=clean | env)


def test_dllm_serve_on_all_addresses_without_keys_warns(tmp_path):
    with _held_port() as held:
        port = str(held.getsockname()[1])
        argv = [sys.executable, "-m", "engine_pod.cli.main", "serve", "--host", "0.0.0.0", "--port", port]
        done = _run([*argv, "--data-dir", str(tmp_path)], {})
        with_keys = _run([*argv, "--data-dir", str(tmp_path)], {"DLLM_API_KEYS": "key-a"})
    assert done.returncode == 2 and "port " + port + " is in use" in done.stderr, done.stderr
    assert WARNING in done.stderr and "DLLM_API_KEYS" in done.stderr
    assert with_keys.returncode == 2 and WARNING not in with_keys.stderr, with_keys.stderr


def test_python_m_gateway_on_all_addresses_without_keys_warns():
    with _held_port() as held:
        port = str(held.getsockname()[1])
        argv = [sys.executable, "-m", "gateway", "--host", "0.0.0.0", "--port", port]
        done = _run(argv, {"DLLM_MODEL_DIR": str(DEFAULT_MODEL)})
        with_keys = _run(argv, {"DLLM_MODEL_DIR": str(DEFAULT_MODEL), "DLLM_API_KEYS": "key-a"})
    assert done.returncode != 0, done.stderr  # the port is held: it never serves
    assert WARNING in done.stderr and "API keys off" in done.stderr, done.stderr
    assert WARNING not in with_keys.stderr and "API keys on" in with_keys.stderr, with_keys.stderr
    assert "key-a" not in with_keys.stderr
