"""Every manifest the operator builds is a valid Kubernetes object (strict schema check)."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml
from dllm_operator.config import OperatorSettings
from dllm_operator.manifests.engine import EnginePods, profile_configmap
from dllm_operator.manifests.engine_group import engine_workload
from dllm_operator.manifests.gateway import (
    FILES_PATH,
    files_volume_claim,
    gateway_deployment,
    gateway_metrics_service,
    gateway_service,
)
from dllm_operator.manifests.keda import scaled_object
from dllm_operator.manifests.operations import (
    engine_disruption_budget,
    engine_metrics_service,
    service_monitor,
)
from dllm_operator.manifests.profiling import profiling_job
from dllm_operator.manifests.redis import (
    managed_redis_url,
    redis_auth_secret,
    redis_deployment,
    redis_disruption_budget,
    redis_network_policy,
    redis_service,
    redis_volume_claim,
)
from dllm_operator.profile_state import profile_hash_of
from dllm_operator.spec import SpecError, parse_spec

from dllm_contracts.engine_env import THREADS_ENV
from dllm_contracts.profile_summary import ProfileSummary
from dllm_contracts.scheduler_config import DEFAULTS, SERVING_POLICIES
from engine_pod.cli.main import build_parser
from engine_pod.cli.scheduling import scheduler_config
from gateway.settings import ENV_NAMES, EXIT_AFTER_DRAIN_S
from tests.operator.crd_utils import EXAMPLE_PATH, admit

K8S_VERSION = "1.33.0"
OWNER = {"name": "llada-8b", "uid": "0b8f2f4e-1111-2222-3333-444455556666"}


THIRD_PARTY = ("monitoring.coreos.com/",)  # CRDs kubernetes-validate has no schema for


def validate(manifest: dict) -> None:
    """Strict schema check; a third-party kind (ServiceMonitor) gets the object-metadata check only."""
    if manifest["apiVersion"].startswith(THIRD_PARTY):
        assert manifest["metadata"]["name"] and manifest["spec"]
        return
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def example(**changes):
    spec = yaml.safe_load(EXAMPLE_PATH.read_text())["spec"]
    for path, value in changes.items():
        node = spec
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return parse_spec("llada-8b", "default", spec)


def all_manifests(spec) -> list[dict]:
    settings = OperatorSettings(operator_namespace="dllm-system")
    url = managed_redis_url(spec)
    digest = profile_hash_of(spec, settings.engine_image)
    return [
        profiling_job(spec, OWNER, settings, digest),
        profile_configmap(spec, OWNER, json.dumps({"token_budget": 100000}), digest),
        engine_workload(spec, OWNER, EnginePods(settings, url, digest), 2),
        gateway_deployment(spec, OWNER, settings, url),
        gateway_service(spec, OWNER),
        gateway_metrics_service(spec, OWNER),
        redis_deployment(spec, OWNER, settings),
        redis_service(spec, OWNER),
        redis_auth_secret(spec, OWNER, "a-generated-password"),
        redis_volume_claim(spec, OWNER),
        redis_network_policy(spec, OWNER, settings),
        engine_metrics_service(spec, OWNER),
        engine_disruption_budget(spec, OWNER),
        service_monitor(spec, OWNER),
        files_volume_claim(spec, OWNER),
        redis_disruption_budget(spec, OWNER, settings),
    ]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {
            "model__volumeClaim": "models",
            "model__uri": "llada-8b-instruct",
            "resources__nodeSelector": {"gpu": "h200"},
            "resources__tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "gateway__apiKeySecretRef": {"name": "keys", "key": "api-keys"},
        },
        {"resources__gpus": 0, "model__dtype": "float32"},
        {
            "scheduling__policy": "dllm-serve",
            "scheduling__refreshQuota": 0.3,
            "scheduling__refreshInterval": 4,
            "scheduling__cacheShare": 0.5,
        },
        {
            "decoding__sparseCache": {"mode": "head-centric", "headImportanceConfigMap": "llada-8b-heads"},
            "decoding__maxMaterializedLogits": 64,
            "decoding__logitCandidates": 8,
            "decoding__warmPrefixes": ["system:You are a helpful assistant."],
            "decoding__batchInvariant": True,
        },
    ],
)
def test_every_child_manifest_passes_strict_validation(changes):
    for manifest in all_manifests(example(**changes)):
        validate(manifest)


def test_a_diffusion_gemma_service_decodes_canvases_of_its_familys_length():
    """Its example sets no block length: the family's (dllm_contracts/families.py) reaches the profiling Job,
    the engine and the gateway, and a generation length its canvas does not divide is refused."""
    example_spec = yaml.safe_load(
        (EXAMPLE_PATH.parent / "example-diffusion-gemma-dllmservice.yaml").read_text()
    )
    manifests = all_manifests(parse_spec("dgemma", "default", example_spec["spec"]))
    for manifest in manifests:
        validate(manifest)
    job, engine, gateway = (manifests[i]["spec"]["template"]["spec"]["containers"][0] for i in (0, 2, 3))
    assert job["command"][job["command"].index("--block-length") + 1] == "256"
    worker = build_parser().parse_args(engine["command"][1:])
    assert (worker.model, worker.block_length, worker.steps_per_block) == (
        "google/diffusiongemma-26B-A4B-it@main",
        256,
        48,
    )
    assert {e["name"]: e.get("value") for e in gateway["env"]}["DLLM_BLOCK_LENGTH"] == "256"
    with pytest.raises(SpecError, match=r"blockLength must divide .* \(diffusion_gemma: 256 and 300\)"):
        parse_spec("dgemma", "default", example_spec["spec"] | {"decoding": {"maxGenerationTokens": 300}})


def test_children_are_owned_non_root_and_read_only():
    for manifest in all_manifests(example()):
        assert manifest["metadata"]["ownerReferences"][0]["uid"] == OWNER["uid"]
        pod = manifest.get("spec", {}).get("template", {}).get("spec")
        if pod:
            assert pod["securityContext"]["runAsNonRoot"]
            for container in pod["containers"] + pod.get("initContainers", []):
                assert container["securityContext"]["readOnlyRootFilesystem"]


def test_engine_pods_take_the_budget_from_the_profile_configmap():
    deployment = all_manifests(example())[2]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--profile" in container["command"] and container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert any(
        v.get("configMap", {}).get("name") == "llada-8b-profile"
        for v in deployment["spec"]["template"]["spec"]["volumes"]
    )


@pytest.mark.parametrize(
    ("example_file", "family"),
    [
        ("example-dllmservice.yaml", "llada"),
        ("example-dream-dllmservice.yaml", "dream"),
        ("example-diffusion-gemma-dllmservice.yaml", "diffusion_gemma"),
    ],
)
def test_the_profiling_job_and_the_engines_expect_the_services_model_family(example_file, family):
    """dllm profile and dllm worker get --family spec.model.family: a checkpoint of another family is
    refused by the engine before it serves, instead of being served as whatever family it is."""
    spec = yaml.safe_load((EXAMPLE_PATH.parent / example_file).read_text())["spec"]
    manifests = all_manifests(parse_spec("svc", "default", spec))
    job, engine = (manifests[i]["spec"]["template"]["spec"]["containers"][0]["command"] for i in (0, 2))
    assert job[:2] == ["dllm", "profile"] and engine[:2] == ["dllm", "worker"]
    assert build_parser().parse_args(job[1:]).family == family
    assert build_parser().parse_args(engine[1:]).family == family


def test_engine_command_is_what_dllm_worker_accepts_with_the_scheduling_fields():
    def worker_args(spec):
        command = all_manifests(spec)[2]["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[:2] == ["dllm", "worker"]
        return build_parser().parse_args(command[1:])

    args = worker_args(
        example(
            scheduling__admission="projected",
            scheduling__minPaddingEfficiency=0.5,
            scheduling__maxRows=64,
            scheduling__maxWaitSeconds=2.5,
            scheduling__batchWindowSeconds=0.0,
            scheduling__batchMaxWaitSeconds=120,
            scheduling__batchMaxRows=4,
        )
    )
    assert (args.admission, args.min_padding_efficiency, args.threshold) == ("projected", 0.5, 0.9)
    assert (args.max_rows, args.max_wait, args.batch_window) == (64, 2.5, 0.0)
    assert (args.batch_max_wait, args.batch_max_rows) == (120.0, 4)
    defaults = worker_args(example())
    settings = (
        defaults.admission,
        defaults.min_padding_efficiency,
        defaults.max_rows,
        defaults.max_wait,
        defaults.batch_window,
        defaults.batch_max_wait,
        defaults.batch_max_rows,
    )
    assert settings == (
        DEFAULTS.admission,
        DEFAULTS.min_padding_efficiency,
        DEFAULTS.max_rows,
        DEFAULTS.max_wait_s,
        DEFAULTS.batch_window_s,
        DEFAULTS.batch_max_wait_s,
        DEFAULTS.batch_max_rows,
    )


def engine_worker_args(spec):
    """The engine container's command as `dllm worker` parses it."""
    command = all_manifests(spec)[2]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["dllm", "worker"]
    return build_parser().parse_args(command[1:])


def test_the_scheduling_policy_and_its_refresh_settings_reach_dllm_worker():
    args = engine_worker_args(
        example(
            scheduling__policy="dllm-serve",
            scheduling__refreshQuota=0.25,
            scheduling__batchRefreshQuota=0.9,
            scheduling__refreshInterval=4,
            scheduling__cacheShare=0.5,
            scheduling__stepLevel=False,
        )
    )
    assert (args.policy, args.refresh_quota, args.batch_refresh_quota) == ("dllm-serve", 0.25, 0.9)
    assert (args.refresh_interval, args.cache_share, args.step_level) == (4, 0.5, False)
    defaults = engine_worker_args(example())
    assert (defaults.policy, defaults.refresh_quota, defaults.batch_refresh_quota) == (
        SERVING_POLICIES[0],
        DEFAULTS.refresh_quota,
        DEFAULTS.batch_refresh_quota,
    )
    assert (defaults.refresh_interval, defaults.step_level) == (
        DEFAULTS.refresh_interval,
        DEFAULTS.step_level,
    )
    assert defaults.cache_share is None  # no --cache-share: the worker takes its profile's


def test_engines_take_the_profiles_cache_share_unless_the_spec_sets_one(tmp_path):
    """A spec without scheduling.cacheShare leaves the measure to the profile the engine mounts."""
    profile = tmp_path / "profile.json"

    def cache_share(spec) -> float:
        args = engine_worker_args(spec)
        args.profile = str(profile)  # the mounted ConfigMap's file, here
        return scheduler_config(args).cache_share

    profile.write_text(ProfileSummary(token_budget=100000, source="spec", cache_share=0.35).to_json())
    assert cache_share(example(scheduling__policy="dllm-serve")) == 0.35
    assert cache_share(example(scheduling__policy="dllm-serve", scheduling__cacheShare=0.5)) == 0.5
    profile.write_text(ProfileSummary(token_budget=100000, source="spec").to_json())
    assert cache_share(example(scheduling__policy="dllm-serve")) == DEFAULTS.cache_share


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("policy", "fifo", "scheduling.policy must be one of blockserve, dllm-serve, static, sequential"),
        ("refreshQuota", 0, r"scheduling.refreshQuota must be in \(0, 1\], got 0"),
        ("batchRefreshQuota", 1.5, r"scheduling.batchRefreshQuota must be in \(0, 1\], got 1.5"),
        ("refreshInterval", -1, "scheduling.refreshInterval must be at least 0 forwards, got -1"),
        ("cacheShare", 0, r"scheduling.cacheShare must be in \(0, 1\], got 0"),
    ],
)
def test_the_operator_refuses_scheduling_settings_out_of_range(field, value, message):
    with pytest.raises(SpecError, match=message):
        example(**{f"scheduling__{field}": value})


SPARSE = {
    "mode": "head-centric",
    "retention": 0.4,
    "coreShare": 0.1,
    "minorShare": 0.3,
    "minorRetention": 0.1,
    "consistency": 0.8,
    "scoring": "mean-query-logit",
    "poolKernel": 3,
    "selection": "shared",
    "selectionDelay": 1,
    "headImportanceConfigMap": "llada-8b-heads",
}
WARM = ["system:You are a helpful assistant.", "Translate into French:"]


def test_the_decoding_options_reach_dllm_worker():
    """spec.decoding's head-sparse cache, logit budget, warm prefixes and batch invariance, as the worker
    parses them."""
    spec = example(
        decoding__sparseCache=SPARSE,
        decoding__maxMaterializedLogits=64,
        decoding__logitCandidates=8,
        decoding__warmPrefixes=WARM,
        decoding__batchInvariant=True,
    )
    args = engine_worker_args(spec)
    assert args.batch_invariant == (True,)
    assert (args.sparse_cache, args.retention, args.core_share, args.minor_share) == (
        "head-centric",
        0.4,
        0.1,
        0.3,
    )
    assert (args.minor_retention, args.sparse_consistency) == (0.1, 0.8)
    assert (args.sparse_scoring, args.sparse_pool_kernel) == ("mean-query-logit", 3)
    assert (args.sparse_selection, args.selection_delay) == ("shared", 1)
    assert args.head_importance == "/etc/dllm/head-importance/heads.json"
    assert (args.max_materialized_logits, args.logit_candidates) == (64, 8)
    assert args.warm_prefix == WARM
    # the importance file: the ConfigMap's heads.json, where --head-importance reads it
    pod = all_manifests(spec)[2]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "head-importance")
    assert volume["configMap"] == {
        "name": "llada-8b-heads",
        "items": [{"key": "heads.json", "path": "heads.json"}],
    }
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "head-importance")
    assert mount["mountPath"] == "/etc/dllm/head-importance" and mount["readOnly"]
    # absent, nothing is passed: the worker's own defaults
    command = all_manifests(example())[2]["spec"]["template"]["spec"]["containers"][0]["command"]
    passed = {"--sparse-cache", "--head-importance", "--max-materialized-logits", "--logit-candidates"}
    assert not passed & set(command) and "--warm-prefix" not in command
    defaults = engine_worker_args(example())
    assert (defaults.sparse_cache, defaults.head_importance, defaults.warm_prefix) == ("off", None, None)
    assert (
        defaults.batch_invariant
        == engine_worker_args(example(decoding__batchInvariant=False)).batch_invariant
        == (False,)
    )
    assert (defaults.max_materialized_logits, defaults.logit_candidates) == (None, 0)


def test_dllm_serve_engines_run_the_sparse_cache_the_service_sets():
    spec = example(
        decoding__sparseCache={"mode": "uniform", "retention": 0.3}, scheduling__policy="dllm-serve"
    )
    args = engine_worker_args(spec)
    assert (args.policy, args.sparse_cache, args.retention) == ("dllm-serve", "uniform", 0.3)


def test_a_uniform_sparse_cache_needs_no_importance_file():
    spec = example(decoding__sparseCache={"mode": "uniform", "retention": 0.25})
    args = engine_worker_args(spec)
    assert (args.sparse_cache, args.retention, args.head_importance) == ("uniform", 0.25, None)
    pod = all_manifests(spec)[2]["spec"]["template"]["spec"]
    assert all(v["name"] != "head-importance" for v in pod["volumes"])


def test_the_logit_budget_reaches_the_profiling_job_and_its_hash():
    """The logits are part of the peak a profile measures: the Job runs with the engines' budget, and a
    new budget is a new profile (none set: the hash of before)."""
    spec = example(decoding__maxMaterializedLogits=64, decoding__logitCandidates=8)
    command = all_manifests(spec)[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["dllm", "profile"]
    args = build_parser().parse_args(command[1:])
    assert (args.max_materialized_logits, args.logit_candidates) == (64, 8)
    image = OperatorSettings(operator_namespace="dllm-system").engine_image
    assert profile_hash_of(spec, image) != profile_hash_of(example(), image)
    assert profile_hash_of(example(decoding__warmPrefixes=WARM), image) == profile_hash_of(example(), image)


def test_batch_invariance_reaches_the_profiling_job_and_its_hash():
    """Under the setting every batch runs packed: the Job profiles that layout, and turning it on is a new
    profile (off, or absent: the hash of before)."""
    spec = example(decoding__batchInvariant=True)
    command = all_manifests(spec)[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["dllm", "profile"] and build_parser().parse_args(command[1:]).batch_invariant == (
        True,
    )
    off = all_manifests(example())[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--batch-invariant" not in off
    image = OperatorSettings(operator_namespace="dllm-system").engine_image
    assert profile_hash_of(spec, image) != profile_hash_of(example(), image)
    assert profile_hash_of(example(decoding__batchInvariant=False), image) == profile_hash_of(
        example(), image
    )


def test_the_sparse_cache_reaches_the_profiling_job_its_hash_and_the_engines_check(tmp_path):
    """The profile measures the cache the engines run: the Job takes the spec's head-sparse flags and the
    importance ConfigMap, a new setting is a new profile (off: the hash of before), and the engine accepts
    the summary such a Job reports (it records the settings) for its own flags."""
    spec = example(decoding__sparseCache=SPARSE)
    job = all_manifests(spec)[0]["spec"]["template"]["spec"]
    args = build_parser().parse_args(job["containers"][0]["command"][1:])
    assert (args.sparse_cache, args.retention, args.minor_retention) == ("head-centric", 0.4, 0.1)
    assert args.head_importance == "/etc/dllm/head-importance/heads.json"
    assert any(m["name"] == "head-importance" for m in job["containers"][0]["volumeMounts"])
    assert any((v.get("configMap") or {}).get("name") == "llada-8b-heads" for v in job["volumes"])
    image = OperatorSettings(operator_namespace="dllm-system").engine_image
    hashes = {
        profile_hash_of(example(decoding__sparseCache={"mode": mode}), image) for mode in ("off", "uniform")
    }
    assert len(hashes | {profile_hash_of(spec, image), profile_hash_of(example(), image)}) == 3
    assert profile_hash_of(
        example(decoding__sparseCache=SPARSE | {"consistency": 0.5}), image
    ) == profile_hash_of(spec, image)  # what is kept, not how much
    # the profile records what it measured (the settings `dllm profile` got) and the engine's flags match it
    recorded = {"mode": "head-centric", "retention": 0.4, "minor_retention": 0.1, "core_share": 0.1}
    summary = ProfileSummary(
        token_budget=100000,
        device="cuda:0",
        device_name="H100",
        dtype="bfloat16",
        total_memory_bytes=2**36,
        usable_memory_bytes=2**35,
        weights_bytes=2**33,
        sparse_cache=recorded | {"minor_share": 0.3},
    )
    profile = tmp_path / "profile.json"
    profile.write_text(summary.to_json())
    engine = engine_worker_args(spec)
    engine.profile = str(profile)  # the mounted ConfigMap's file, here
    assert scheduler_config(engine).token_budget == 100000


@pytest.mark.parametrize(
    "decoding, message",
    [
        (
            {"sparseCache": {"mode": "uniform", "retention": 1.5}},
            r"decoding.sparseCache.retention must be in \(0, 1\], got 1.5",
        ),
        (
            {"sparseCache": {"mode": "lossy"}},
            "decoding.sparseCache.mode must be one of off, head-centric, uniform",
        ),
        (
            {"sparseCache": SPARSE | {"minorRetention": 0.3}},
            r"decoding.sparseCache.minorRetention must be in \(0, 0.2\], got 0.3",
        ),
        (
            {"sparseCache": SPARSE | {"coreShare": 0.7, "minorShare": 0.4}},
            "decoding.sparseCache.minorShare and the core share together must be at most 1",
        ),
        (
            {"sparseCache": {"mode": "uniform", "consistency": 2}},
            r"decoding.sparseCache.consistency must be in \[-1, 1\]",
        ),
        (
            {"sparseCache": {"mode": "uniform", "poolKernel": 4}},
            "decoding.sparseCache.poolKernel must be an odd whole number from 1 to 15, got 4",
        ),
        (
            {"sparseCache": {"mode": "uniform", "selectionDelay": 40}},
            "decoding.sparseCache.selectionDelay must be a whole number from 0 to 32, got 40",
        ),
        (
            {"sparseCache": {"mode": "uniform", "scoring": "attention"}},
            "decoding.sparseCache.scoring must be one of probability, mean-query-logit",
        ),
        (
            {"sparseCache": {"mode": "uniform", "selection": "all"}},
            "decoding.sparseCache.selection must be one of per-head, shared",
        ),
        (
            {"sparseCache": {"mode": "uniform", "coreShare": -0.1}},
            r"decoding.sparseCache.coreShare must be in \[0, 1\]",
        ),
        (
            {"sparseCache": {"mode": "head-centric"}},
            "decoding.sparseCache.headImportanceConfigMap is required",
        ),
        (
            {"sparseCache": {"mode": "uniform"}, "cache": "prefix"},
            "decoding.sparseCache needs decoding.cache dual",
        ),
        ({"maxMaterializedLogits": 0}, "decoding.maxMaterializedLogits must be at least 1 position, got 0"),
        ({"logitCandidates": -1}, "decoding.logitCandidates must be at least 0, got -1"),
        ({"warmPrefixes": WARM, "cache": "none"}, "decoding.warmPrefixes need a KV cache"),
    ],
)
def test_the_operator_refuses_decoding_options_out_of_range(decoding, message):
    with pytest.raises(SpecError, match=message):
        example(**{f"decoding__{field}": value for field, value in decoding.items()})


def test_the_operator_refuses_decoding_options_the_worker_would_refuse():
    with pytest.raises(SpecError, match="decoding.warmPrefixes need scheduling.policy blockserve"):
        example(decoding__warmPrefixes=WARM, scheduling__policy="static")
    with pytest.raises(SpecError, match="decoding.sparseCache runs in one process"):
        example(decoding__sparseCache={"mode": "uniform"}, parallelism={"tensor": 2})


@pytest.mark.parametrize(
    "model, changes, message",
    [
        ("llada2", {"scheduling__policy": "dllm-serve"}, "not LLaDA2.0 with --cache dual"),
        ("sdar", {"scheduling__policy": "dllm-serve"}, "not SDAR with --cache dual"),
        (
            "dream",
            {"scheduling__policy": "dllm-serve", "decoding__remasking": "low_confidence"},
            "--remasking threshold, not Dream with --cache dual and --remasking low_confidence",
        ),
        ("diffusion_gemma", {"scheduling__policy": "dllm-serve"}, "not DiffusionGemma"),
        (
            "llada2",
            {"decoding__sparseCache": {"mode": "uniform"}},
            "supports LLaDA and Dream (dual cache), not LLaDA2.0",
        ),
        ("diffusion_gemma", {"decoding__sparseCache": {"mode": "uniform"}}, "not DiffusionGemma"),
    ],
)
def test_the_operator_refuses_what_the_engine_refuses_for_the_family(model, changes, message):
    """The engine's own rules (dllm_contracts/run_rules.py), judged on the spec's family."""
    family = {"model__family": model, "decoding__blockLength": 32, "decoding__stepsPerBlock": 32}
    with pytest.raises(SpecError, match=re.escape(message)):
        example(**family, **changes)
    assert example(**family).family == model  # the family alone runs
    example(scheduling__policy="dllm-serve")  # LLaDA, dual cache, threshold: dllm-serve runs
    example(model__family="dream", decoding__sparseCache={"mode": "uniform"})


def test_profile_job_uses_the_termination_log_and_never_restarts():
    job = all_manifests(example())[0]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert "--termination-log" in pod["containers"][0]["command"]
    # a crash before the message is written still says why (the log's tail)
    assert pod["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # a profile that cannot be scheduled or hangs fails, instead of Profiling forever
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    assert all_manifests(example(profiling__timeoutSeconds=600))[0]["spec"]["activeDeadlineSeconds"] == 600


def test_keda_scaled_object_counts_the_service_sorted_sets():
    spec = example(redis__managed=False, redis__url="redis://redis.queue:6380/2", replicas__keda=True)
    scaled = scaled_object(spec, OWNER, spec.redis_url)
    triggers = scaled["spec"]["triggers"]
    # one trigger on pending + in flight (two would scale on the larger), the service as hash tag
    assert [t["metadata"]["listName"] for t in triggers] == ["dllm:{default-llada-8b}:live"]
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == spec.scale_down_delay_s == 300
    assert triggers[0]["type"] == "redis"
    assert (
        triggers[0]["metadata"]["address"] == "redis.queue:6380"
        and triggers[0]["metadata"]["databaseIndex"] == "2"
    )
    assert scaled["spec"]["maxReplicaCount"] == 4


def test_keda_on_a_redis_cluster_uses_the_cluster_scaler_and_the_password():
    spec = example(
        redis__managed=False,
        redis__url="redis+cluster://redis-0.queue:7000",
        redis__passwordSecretRef={"name": "queue-auth", "key": "password"},
        replicas__keda=True,
    )
    triggers = scaled_object(spec, OWNER, spec.redis_url)["spec"]["triggers"]
    assert {t["type"] for t in triggers} == {"redis-cluster"}
    metadata = triggers[0]["metadata"]
    assert metadata["addresses"] == "redis-0.queue:7000" and "databaseIndex" not in metadata
    assert metadata["passwordFromEnv"] == "REDIS_PASSWORD"


def test_memory_relevant_changes_change_the_profile_hash_and_others_do_not():
    base = profile_hash_of(example(), "img")
    assert profile_hash_of(example(model__dtype="float16"), "img") != base
    assert profile_hash_of(example(resources__memory="80Gi"), "img") != base
    assert profile_hash_of(example(decoding__threshold=0.5), "img") == base
    assert profile_hash_of(example(replicas__max=8), "img") == base
    assert profile_hash_of(example(model__revision="0" * 40), "img") != base  # a new checkpoint revision
    assert profile_hash_of(example(model__revision=None), "img") != base


def test_the_example_pins_a_revision_downloads_once_into_the_shared_cache_with_the_token():
    spec = example()
    engine = engine_workload(spec, OWNER, EnginePods(OperatorSettings(), "redis://r:6379/0", "h"), 1)
    job = profiling_job(spec, OWNER, OperatorSettings(), "h")
    for pod in (engine["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        command = pod["containers"][0]["command"]
        assert command[command.index("--model") + 1] == "GSAI-ML/LLaDA-8B-Instruct@main"
        cache = next(v for v in pod["volumes"] if v["name"] == "cache")
        assert cache == {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}}
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
        assert env["HF_HOME"]["value"] == "/cache/huggingface"


def test_operator_rechecks_what_cel_would_reject():
    with pytest.raises(SpecError, match="replicas.min"):
        example(replicas__min=9)
    with pytest.raises(SpecError, match="minPaddingEfficiency"):
        example(scheduling__minPaddingEfficiency=1.5)
    with pytest.raises(SpecError, match="scheduling.maxWaitSeconds must be at least 0"):
        example(scheduling__maxWaitSeconds=-0.5)
    with pytest.raises(SpecError, match=r"scheduling.batchWindowSeconds must be in \[0, 1.0\]"):
        example(scheduling__batchWindowSeconds=5)
    with pytest.raises(SpecError, match="scheduling.batchMaxRows must be at least 0"):
        example(scheduling__batchMaxRows=-1)
    with pytest.raises(SpecError, match="resources.nodeSelector key 'bad key' is not a label key"):
        example(resources__nodeSelector={"bad key": "x"})
    assert example(resources__nodeSelector={"nvidia.com/gpu.product": "H100", "pool": "a"}).node_selector


def test_gateway_liveness_checks_the_process_and_readiness_checks_redis():
    gateway = all_manifests(example())[3]
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"  # never a dependency
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("processes", [1, 3])
def test_gateway_processes_per_pod_reach_the_gateway_and_its_cpu_request(processes):
    manifests = all_manifests(example(gateway__processes=processes))
    gateway = manifests[3]
    validate(gateway)
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["DLLM_GATEWAY_PROCESSES"] == str(processes)
    assert container["resources"]["requests"]["cpu"] == f"{500 * processes}m"


def test_engine_pods_fetch_a_downloaded_model_first_and_probe_only_its_loading():
    pod = all_manifests(example())[2]["spec"]["template"]["spec"]
    [fetch] = pod["initContainers"]  # the Hub repo is fetched before the engine starts
    assert fetch["command"][:4] == [
        "python",
        "-m",
        "dllm_contracts.fetch_model",
        "GSAI-ML/LLaDA-8B-Instruct@main",
    ]
    container = pod["containers"][0]
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/startupz"  # answers once the model is loaded
    assert 600 <= startup["periodSeconds"] * startup["failureThreshold"] <= 1800  # loading, no download
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_gpu_engine_pods_roll_one_at_a_time_without_a_spare_gpu():
    strategy = all_manifests(example())[2]["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "rollingUpdate" not in all_manifests(example(resources__gpus=0))[2]["spec"]["strategy"]


def _by_kind(manifests: list[dict], kind: str) -> dict:
    return next(m for m in manifests if m["kind"] == kind and "redis" in m["metadata"]["name"])


def test_managed_redis_has_a_password_a_volume_a_memory_cap_and_a_network_policy():
    manifests = all_manifests(example())
    redis = _by_kind(manifests, "Deployment")["spec"]["template"]["spec"]
    args = redis["containers"][0]["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"  # refuse writes, never drop requests
    assert redis["volumes"][0]["persistentVolumeClaim"]["claimName"] == "llada-8b-redis-data"  # not emptyDir
    secret = _by_kind(manifests, "Secret")["metadata"]["name"]
    for pod in (m for m in manifests if m["kind"] == "Deployment"):
        env = {e["name"]: e for c in pod["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == secret, pod["metadata"]["name"]
    assert _by_kind(manifests, "PersistentVolumeClaim")["spec"]["resources"]["requests"]["storage"] == "8Gi"
    policy = _by_kind(manifests, "NetworkPolicy")["spec"]
    peers = policy["ingress"][0]["from"]
    assert peers[0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/instance": "llada-8b"}
    assert peers[1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "dllm-system"


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_in_keda_mode_the_managed_redis_admits_kedas_operator_and_nothing_more():
    """KEDA's redis scaler runs in keda-operator (the metrics server asks it over gRPC): its pods, by the
    label KEDA's Helm chart and release manifests both select them on, in KEDA's namespace."""
    settings = OperatorSettings(operator_namespace="dllm-system")
    keda_pod = {"app": "keda-operator", "name": "keda-operator", "app.kubernetes.io/name": "keda-operator"}
    for keda, admitted in ((True, True), (False, False)):
        policy = redis_network_policy(example(replicas__keda=keda), OWNER, settings)
        validate(policy)
        peers = policy["spec"]["ingress"][0]["from"]
        from_keda = [
            p
            for p in peers
            if p.get("namespaceSelector", {}).get("matchLabels") == {"kubernetes.io/metadata.name": "keda"}
            and _matches(p["podSelector"]["matchLabels"], keda_pod)
        ]
        assert bool(from_keda) == admitted and len(peers) == 2 + admitted
        assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 6379}]
    elsewhere = OperatorSettings(keda_namespace="autoscaling", keda_operator_app="keda-op")
    peers = redis_network_policy(example(replicas__keda=True), OWNER, elsewhere)["spec"]["ingress"][0]["from"]
    assert peers[-1] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "autoscaling"}},
        "podSelector": {"matchLabels": {"app": "keda-op"}},
    }
    none = OperatorSettings(keda_namespace="")
    assert (
        len(redis_network_policy(example(replicas__keda=True), OWNER, none)["spec"]["ingress"][0]["from"])
        == 1
    )


@pytest.mark.parametrize("max_unavailable", [1, 0])
def test_the_managed_redis_has_a_disruption_budget_over_its_pod(max_unavailable):
    spec = example()
    settings = OperatorSettings(redis_max_unavailable=max_unavailable)
    budget = redis_disruption_budget(spec, OWNER, settings)
    validate(budget)
    assert budget["spec"]["maxUnavailable"] == max_unavailable
    assert budget["metadata"]["ownerReferences"][0]["uid"] == OWNER["uid"]
    pod_labels = redis_deployment(spec, OWNER, settings)["spec"]["template"]["metadata"]["labels"]
    assert _matches(budget["spec"]["selector"]["matchLabels"], pod_labels)
    engine_budget = engine_disruption_budget(spec, OWNER)  # each budget covers its own pods only
    assert budget["metadata"]["name"] != engine_budget["metadata"]["name"]
    assert not _matches(engine_budget["spec"]["selector"]["matchLabels"], pod_labels)


def test_redis_max_unavailable_is_read_from_the_environment_and_checked(monkeypatch):
    monkeypatch.setenv("DLLM_REDIS_MAX_UNAVAILABLE", "0")
    monkeypatch.setenv("DLLM_KEDA_NAMESPACE", "autoscaling")
    settings = OperatorSettings.from_env()
    assert (settings.redis_max_unavailable, settings.keda_namespace) == (0, "autoscaling")
    monkeypatch.setenv("DLLM_REDIS_MAX_UNAVAILABLE", "2")
    with pytest.raises(ValueError, match="DLLM_REDIS_MAX_UNAVAILABLE must be 0 or 1"):
        OperatorSettings.from_env()


def test_gateway_pods_leave_the_endpoints_then_drain_within_their_grace_period():
    """preStop waits (serving) while the endpoints drop the pod; SIGTERM then starts the drain the
    gateway reads from DLLM_DRAIN_TIMEOUT_S; the grace period outlasts both and the shutdown after."""
    gateway = gateway_deployment(example(), OWNER, OperatorSettings(), "redis://r:6379/0")
    validate(gateway)
    pod = gateway["spec"]["template"]["spec"]
    container = pod["containers"][0]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    drain = float(env["DLLM_DRAIN_TIMEOUT_S"])
    assert pre_stop >= 3 and drain > 0
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + EXIT_AFTER_DRAIN_S + 5


def test_engine_pods_finish_their_drain_within_their_grace_period():
    engine = engine_workload(example(), OWNER, EnginePods(OperatorSettings(), "redis://r:6379/0", "h"), 1)
    pod = engine["spec"]["template"]["spec"]
    worker = build_parser().parse_args(pod["containers"][0]["command"][1:])
    assert pod["terminationGracePeriodSeconds"] >= worker.drain_timeout + 15  # hand back, exit


def test_an_external_redis_password_reaches_engine_and_gateway():
    spec = example(
        redis__managed=False,
        redis__url="redis://redis.queue:6379/0",
        redis__passwordSecretRef={"name": "queue-auth", "key": "password"},
    )
    for deployment in all_manifests(spec)[2:4]:
        env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "queue-auth", "key": "password"}


def test_the_operator_refuses_what_admission_should_have_even_when_it_did_not():
    """kmock runs no admission: the operator's own check is the last line (a Degraded condition)."""
    for changes, message in [
        ({"resources__gpus": 2}, "resources.gpus must be 0 or 1"),
        ({"decoding__stepsPerBlock": 64}, "stepsPerBlock must not exceed"),
        (
            {"redis__managed": False, "redis__url": "redis://:pw@redis.queue:6379/0"},
            "must not carry credentials",
        ),
    ]:
        with pytest.raises(SpecError, match=message):
            example(**changes)


def test_model_cache_and_hugging_face_token_reach_the_job_and_the_engine():
    spec = example(
        model__cacheVolumeClaim="model-cache", model__hfTokenSecretRef={"name": "hf", "key": "token"}
    )
    manifests = all_manifests(spec)
    for manifest in manifests[0], manifests[2]:  # the profiling Job, the engine Deployment
        pod = manifest["spec"]["template"]["spec"]
        cache = next(v for v in pod["volumes"] if v["name"] == "cache")
        assert cache["persistentVolumeClaim"]["claimName"] == "model-cache"
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    gateway = manifests[3]["spec"]["template"]["spec"]
    assert "emptyDir" in next(v for v in gateway["volumes"] if v["name"] == "cache")  # tokenizer only


def test_engine_has_a_disruption_budget_and_a_service_monitor_finds_both_metrics_services():
    manifests = all_manifests(example())
    budget = next(m for m in manifests if m["kind"] == "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    monitor = next(m for m in manifests if m["kind"] == "ServiceMonitor")["spec"]
    services = [m for m in manifests if m["kind"] == "Service"]
    scraped = [
        s
        for s in services
        if all(s["metadata"]["labels"].get(k) == v for k, v in monitor["selector"]["matchLabels"].items())
        and "dllm.dev/metrics" in s["metadata"]["labels"]
    ]
    ports = {p["name"] for s in scraped for p in s["spec"]["ports"]}
    assert {e["port"] for e in monitor["endpoints"]} == ports == {"metrics"}
    assert {s["metadata"]["labels"]["dllm.dev/metrics"] for s in scraped} == {"engine", "gateway"}
    api = gateway_service(example(), OWNER)  # what clients reach: no metrics port
    assert {p["name"] for p in api["spec"]["ports"]} == {"http"} and "dllm.dev/metrics" not in api[
        "metadata"
    ]["labels"]
    gateway = next(m for m in manifests if m["kind"] == "Deployment" and "gateway" in m["metadata"]["name"])
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    assert env["DLLM_METRICS_PORT"] == str(port) and env["DLLM_METRICS_HOST"] == "0.0.0.0"


def _model_identities(spec) -> tuple[str, str]:
    """What the gateway stamps requests with, and what the engine checks them against."""
    manifests = all_manifests(spec)
    gateway = manifests[3]["spec"]["template"]["spec"]["containers"][0]
    command = manifests[2]["spec"]["template"]["spec"]["containers"][0]["command"]
    stamped = {item["name"]: item.get("value") for item in gateway["env"]}["DLLM_MODEL_IDENTITY"]
    return stamped, command[command.index("--model-identity") + 1]


def test_gateway_and_engines_share_a_model_identity_that_a_new_model_changes():
    """Requests accepted before the model changed are never answered by the new model's engines."""
    stamped, checked = _model_identities(example())
    assert stamped == checked and stamped.startswith("LLaDA-8B-Instruct@")
    for change in (
        {"model__revision": "abc123"},
        {"model__uri": "GSAI-ML/LLaDA-1.5"},
        {"model__dtype": "float16"},
    ):
        assert _model_identities(example(**change))[0] not in (stamped, "")
    assert _model_identities(example(autoscaling__maxReplicas=9))[0] == stamped


def test_engine_and_profiling_pods_run_as_many_torch_threads_as_cpus_requested():
    spec = example(resources__cpu="1500m")
    engine = engine_workload(spec, OWNER, EnginePods(OperatorSettings(), "redis://r:6379/0", "h"), 1)
    job = profiling_job(spec, OWNER, OperatorSettings(), "h")
    for manifest in (engine, job):
        validate(manifest)
        container = manifest["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        field = env[THREADS_ENV]["valueFrom"]["resourceFieldRef"]
        assert field == {"resource": "requests.cpu", "divisor": "1"}  # 1500m: 2 threads (rounded up)
        assert container["resources"]["requests"]["cpu"] == "1500m"


def _gateway_pod(spec) -> dict:
    settings = OperatorSettings(operator_namespace="dllm-system")
    deployment = gateway_deployment(spec, OWNER, settings, managed_redis_url(spec))
    validate(deployment)
    return deployment["spec"]["template"]["spec"]


def test_gateways_keep_files_on_their_volume_or_in_a_bucket():
    spec = example()  # two gateway replicas, files on a ReadWriteOnce volume: the pods share its node
    pod = _gateway_pod(spec)
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["DLLM_FILE_STORE"] == FILES_PATH and env["DLLM_STORAGE_QUOTA_BYTES"] == "0"
    assert {"name": "files", "mountPath": FILES_PATH} in pod["containers"][0]["volumeMounts"]
    claim = next(v for v in pod["volumes"] if v["name"] == "files")["persistentVolumeClaim"]["claimName"]
    volume = files_volume_claim(spec, OWNER)
    validate(volume)
    assert volume["metadata"]["name"] == claim and volume["spec"]["accessModes"] == ["ReadWriteOnce"]
    together = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert together["topologyKey"] == "kubernetes.io/hostname"
    shared = example(gateway__files={"accessMode": "ReadWriteMany", "storage": "50Gi"})
    assert "affinity" not in _gateway_pod(shared)
    assert files_volume_claim(shared, OWNER)["spec"]["accessModes"] == ["ReadWriteMany"]
    bucket = example(
        gateway__files={
            "store": "s3://uploads/dllm",
            "endpointUrl": "http://minio.storage:9000",
            "credentialsSecretName": "s3-credentials",
            "quotaBytes": 1 << 30,
        }
    )
    pod = _gateway_pod(bucket)
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["DLLM_FILE_STORE"] == "s3://uploads/dllm"
    assert env["DLLM_S3_ENDPOINT_URL"] == "http://minio.storage:9000"
    assert env["DLLM_STORAGE_QUOTA_BYTES"] == str(1 << 30)
    assert pod["containers"][0]["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert "files" not in {v["name"] for v in pod["volumes"]} and "affinity" not in pod


def test_an_otlp_endpoint_sends_the_gateway_and_engine_traces_there():
    def env_of(manifests, index):
        container = manifests[index]["spec"]["template"]["spec"]["containers"][0]
        return {item["name"]: item.get("value") for item in container["env"]}

    endpoint = "http://otel-collector.observability:4318"
    manifests = all_manifests(example(monitoring__otlpEndpoint=endpoint))
    for index in (2, 3):  # the engine, the gateway
        validate(manifests[index])
        assert env_of(manifests, index)["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint
    untraced = all_manifests(example())
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env_of(untraced, 2) | env_of(untraced, 3)
    spec = yaml.safe_load(EXAMPLE_PATH.read_text())["spec"]
    assert admit(spec | {"monitoring": {"otlpEndpoint": endpoint}}) == []
    assert admit(spec | {"monitoring": {"otlpEndpoint": "otel-collector:4317"}}) != []


@pytest.mark.parametrize("changes", [{}, {"model__servedName": "house-llada"}])
def test_the_engines_metrics_name_the_model_as_the_gateway_does(changes):
    """The worker's model label (``served_name``, what ``dllm worker`` computes from its flags) is the
    model name the gateway serves: one model on the dashboard, not one per process."""
    from engine_pod.cli.worker import served_name

    spec = example(**changes)
    gateway = all_manifests(spec)[3]["spec"]["template"]["spec"]["containers"][0]
    named = {e["name"]: e.get("value") for e in gateway["env"]}[ENV_NAMES["model_name"]]
    assert (
        served_name(engine_worker_args(spec))
        == named
        == (changes.get("model__servedName") or "LLaDA-8B-Instruct")
    )
