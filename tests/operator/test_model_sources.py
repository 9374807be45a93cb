"""Where a service's weights come from, as the CRD admits it and the operator renders it: an s3:// prefix
and a Hugging Face repo fetched by an init container into the cache volume before the engine and the
profiler start (credentials and endpoint from the spec), a volume path (volumeClaim + path, or
pvc://CLAIM/PATH) mounted with nothing to fetch. The rendered fetch runs here against moto's S3 server,
and the engine's model argument then loads from the cache with the store stopped."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import yaml
from dllm_operator.config import OperatorSettings
from dllm_operator.manifests.engine import EnginePods
from dllm_operator.manifests.engine_group import engine_workload
from dllm_operator.manifests.gateway import gateway_deployment
from dllm_operator.manifests.profiling import profiling_job
from dllm_operator.spec import SpecError, parse_spec

from dllm_contracts.model_source import builtin_model_dir
from tests.operator.crd_utils import EXAMPLE_PATH, admit
from tests.operator.test_manifests import OWNER, all_manifests, validate
from tests.s3_server import KEY_ID, SECRET, S3Server

S3_EXAMPLE = EXAMPLE_PATH.parent / "example-s3-dllmservice.yaml"
REDIS = "redis://r:6379/0"


def s3_spec(**model) -> dict:
    spec = yaml.safe_load(S3_EXAMPLE.read_text())["spec"]
    spec["model"] |= model
    return spec


def pods(spec) -> dict[str, dict]:
    settings = OperatorSettings()
    return {
        "engine": engine_workload(spec, OWNER, EnginePods(settings, REDIS, "h"), 1)["spec"]["template"][
            "spec"
        ],
        "profile": profiling_job(spec, OWNER, settings, "h")["spec"]["template"]["spec"],
        "gateway": gateway_deployment(spec, OWNER, settings, REDIS)["spec"]["template"]["spec"],
    }


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container["env"]}


def test_an_s3_model_is_fetched_by_an_init_container_with_the_stores_endpoint_and_credentials():
    spec = parse_spec("llada-8b-s3", "default", s3_spec())
    for manifest in all_manifests(spec):
        validate(manifest)
    rendered = pods(spec)
    for name in ("engine", "profile"):
        [fetch] = rendered[name]["initContainers"]
        assert fetch["command"] == [
            "python",
            *("-m", "dllm_contracts.fetch_model", "s3://models/llada-8b-instruct"),
            *("--deadline", "3600"),
        ]
        assert {m["mountPath"] for m in fetch["volumeMounts"]} == {"/cache", "/tmp"}
        assert "startupProbe" not in fetch and "livenessProbe" not in fetch  # init containers take none
        main = rendered[name]["containers"][0]
        assert main["command"][main["command"].index("--model") + 1] == "s3://models/llada-8b-instruct"
    [tokenizer] = rendered["gateway"]["initContainers"]
    for container in (
        rendered["engine"]["initContainers"][0],
        rendered["engine"]["containers"][0],
        rendered["profile"]["initContainers"][0],
        tokenizer,
    ):
        env = env_of(container)
        assert env["DLLM_S3_ENDPOINT_URL"]["value"] == "http://minio.minio.svc:9000"
        assert env["DLLM_MODEL_CACHE"]["value"] == "/cache/models"
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "s3-credentials", "key": key}
        assert env["AWS_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    cache = next(v for v in rendered["engine"]["volumes"] if v["name"] == "cache")
    assert cache["persistentVolumeClaim"]["claimName"] == "model-cache"  # fetched once, for every pod


def test_a_pvc_uri_mounts_the_claim_as_volume_claim_and_path_would_with_nothing_to_fetch():
    base = yaml.safe_load(EXAMPLE_PATH.read_text())["spec"]
    del base["model"]["revision"]
    by_uri = copy.deepcopy(base)
    by_uri["model"]["uri"] = "pvc://weights/llada/LLaDA-8B-Instruct"
    by_claim = copy.deepcopy(base)
    by_claim["model"] |= {"uri": "llada/LLaDA-8B-Instruct", "volumeClaim": "weights"}
    assert not admit(by_uri) and not admit(by_claim)
    first, second = parse_spec("a", "default", by_uri), parse_spec("a", "default", by_claim)
    assert first == second and first.model_name == "LLaDA-8B-Instruct"
    rendered = pods(first)
    assert pods(second) == rendered
    for manifest in all_manifests(first):
        validate(manifest)
    for name in ("engine", "profile"):
        assert rendered[name]["initContainers"] == []  # on the volume already
        command = rendered[name]["containers"][0]["command"]
        assert command[command.index("--model") + 1] == "/models/llada/LLaDA-8B-Instruct"
        models = next(v for v in rendered[name]["volumes"] if v["name"] == "models")
        assert models["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}


def test_a_builtin_model_has_nothing_to_fetch():
    spec = yaml.safe_load((EXAMPLE_PATH.parent / "example-cpu-dllmservice.yaml").read_text())["spec"]
    assert pods(parse_spec("tiny", "default", spec))["engine"]["initContainers"] == []


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"uri": "pvc://weights/x", "volumeClaim": "other"}, "a pvc:// uri names its claim"),
        ({"uri": "pvc://weights"}, "a pvc:// uri is pvc://CLAIM/PATH"),
        ({"uri": "pvc://weights/"}, "a pvc:// uri is pvc://CLAIM/PATH"),
        ({"uri": "s3://"}, "an s3:// uri is s3://BUCKET/PREFIX"),
        ({"uri": "s3://models/x", "revision": "main"}, "an s3:// model is downloaded"),
        ({"uri": "s3://models/x", "volumeClaim": "v"}, "an s3:// model is downloaded"),
        ({"uri": "GSAI-ML/LLaDA-8B-Instruct", "s3EndpointUrl": "http://m:9000"}, "are for an s3:// uri"),
    ],
)
def test_the_crd_and_the_operator_refuse_a_source_that_does_not_add_up(model, message):
    spec = yaml.safe_load(S3_EXAMPLE.read_text())["spec"]
    spec["model"] = {k: v for k, v in spec["model"].items() if not k.startswith("s3")} | model
    assert any(message in failure for failure in admit(spec)), admit(spec)
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        parse_spec("a", "default", spec)


def test_the_crd_bounds_the_download_time_and_takes_only_a_url_as_endpoint():
    assert not admit(s3_spec())
    assert admit(s3_spec(downloadTimeoutSeconds=10))
    assert admit(s3_spec(s3EndpointUrl="minio:9000"))
    assert admit(s3_spec(s3CredentialsSecretRef={}))


def _resolved_env(container: dict, secret: dict[str, str], cache: str) -> dict[str, str]:
    """The container's environment as the kubelet would give it, the cache volume mounted at ``cache``."""
    env = {}
    for item in container["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        value = secret.get(ref["key"]) if ref else item.get("value")
        if value is not None:
            env[item["name"]] = value.replace("/cache", cache)
    return env


def test_the_rendered_fetch_then_the_engines_model_argument_load_from_the_cache_without_the_store(tmp_path):
    store = S3Server(tmp_path / "moto.log")
    try:
        store.upload(builtin_model_dir("tiny-llada"), "models", "tiny-llada")
        spec = parse_spec("tiny", "default", s3_spec(uri="s3://models/tiny-llada", s3EndpointUrl=store.url))
        rendered = pods(spec)
        secret = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}
        fetch = rendered["engine"]["initContainers"][0]
        env = os.environ | _resolved_env(fetch, secret, str(tmp_path / "cache"))
        argv = [sys.executable, *fetch["command"][1:]]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
    finally:
        store.stop()
    engine = rendered["engine"]["containers"][0]
    model = engine["command"][engine["command"].index("--model") + 1]
    env = os.environ | _resolved_env(engine, secret, str(tmp_path / "cache"))
    argv = ["-m", "engine_pod.cli.main", "generate", "--model", model, "--chat", "--canvas", "block"]
    done = subprocess.run(
        [sys.executable, *argv, "--prompt", "letters from t to z ."],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "t u v w x y z"


def test_the_operator_reconciles_an_s3_service_fetching_before_the_engine_then_a_volume_path(
    cluster, operator
):
    from tests.operator.test_lifecycle import NAME, complete_profiling, until

    kube = cluster.client()
    service = yaml.safe_load(S3_EXAMPLE.read_text())
    service["metadata"]["name"] = NAME
    kube.create_service(service)
    job = complete_profiling(kube, budget=131072)
    [fetch] = next(j for j in kube.jobs() if j["metadata"]["name"] == job)["spec"]["template"]["spec"][
        "initContainers"
    ]
    assert fetch["name"] == "fetch-model" and "s3://models/llada-8b-instruct" in fetch["command"]

    def engine_inits() -> list[dict] | None:
        deployment = kube.deployment(f"{NAME}-engine")
        return deployment and deployment["spec"]["template"]["spec"]["initContainers"]

    [fetch] = until(kube, engine_inits, "the engine Deployment with its fetch")
    assert env_of(fetch)["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "s3-credentials"
    model = {"uri": "pvc://weights/llada", "s3EndpointUrl": None, "s3CredentialsSecretRef": None}
    kube.patch_service(NAME, {"spec": {"model": model}})
    complete_profiling(kube, budget=131072)  # another model: profiled again
    until(kube, lambda: engine_inits() == [], "the engine with nothing to fetch")
    engine = kube.deployment(f"{NAME}-engine")["spec"]["template"]["spec"]
    assert "/models/llada" in engine["containers"][0]["command"]
