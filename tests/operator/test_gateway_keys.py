"""The gateway's keys on Kubernetes: the Secret named by ``gateway.apiKeySecretRef`` is mounted as the
gateway's keys file (so that the kubelet's updates of it reach the gateway, which re-reads it without a
restart), and the Secret's value, keys separated by commas or one a line with their limits, is read by the
gateway as its keys file."""

from __future__ import annotations

import yaml
from dllm_operator.config import OperatorSettings
from dllm_operator.manifests.gateway import gateway_deployment
from dllm_operator.spec import parse_spec

from gateway.api_keys import ApiKeys
from gateway.settings import ENV_NAMES, GatewaySettings
from tests.operator.crd_utils import EXAMPLE_PATH
from tests.operator.test_manifests import OWNER, validate

SECRET = {"name": "dllm-api-keys", "key": "keys"}


def _gateway(secret_ref: dict | None) -> dict:
    spec = yaml.safe_load(EXAMPLE_PATH.read_text())["spec"]
    if secret_ref:
        spec.setdefault("gateway", {})["apiKeySecretRef"] = secret_ref
    else:
        spec.get("gateway", {}).pop("apiKeySecretRef", None)
    service = parse_spec("llada-8b", "default", spec)
    return gateway_deployment(
        service, OWNER, OperatorSettings(operator_namespace="dllm-system"), "redis://r:6379/0"
    )


def test_the_keys_secret_is_mounted_as_the_keys_file_the_gateway_rereads(tmp_path):
    deployment = _gateway(SECRET)
    validate(deployment)
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert ENV_NAMES["api_keys"] not in env  # an environment variable never changes in a running pod
    path = env[ENV_NAMES["api_keys_file"]]["value"]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"] == {"secretName": SECRET["name"], "items": [{"key": "keys", "path": "keys"}]}
    assert "subPath" not in mount  # a subPath mount is never updated
    assert float(env[ENV_NAMES["api_keys_reload_s"]]["value"]) > 0

    # the Secret's value as the kubelet writes it, read as the gateway reads it
    secret_value = "key-a,key-b\nkey-c rpm=60 tpm=100000 concurrency=8 priority=high\n"
    (tmp_path / "keys").write_text(secret_value)
    keys = ApiKeys(GatewaySettings(api_keys_file=str(tmp_path / "keys")))
    assert keys.accepts("key-a") and keys.accepts("key-b")
    limits = keys.caller("key-c").limits
    assert (limits.rpm, limits.tpm, limits.concurrency, limits.priority) == (60, 100000, 8, "high")


def test_without_a_keys_secret_there_is_no_keys_file():
    pod = _gateway(None)["spec"]["template"]["spec"]
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert ENV_NAMES["api_keys_file"] not in env and ENV_NAMES["api_keys"] not in env
    assert all(v["name"] != "api-keys" for v in pod["volumes"])
