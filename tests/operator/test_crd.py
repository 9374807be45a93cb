"""The CRD: valid structural schema, defaults, CEL rules that reject bad specs, the example accepted."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from dllm_operator.decoding_options import LOGIT_FIELDS
from dllm_operator.scheduling import SCHEDULING_FIELDS, UNSET_BY_DEFAULT
from dllm_operator.sparse_cache import SPARSE_FIELDS
from dllm_operator.spec import parse_spec

from dllm_contracts.families import FAMILY_DECODING
from dllm_contracts.head_sparse_config import MAX_MINOR_RETENTION, MODES
from dllm_contracts.scheduler_config import ADMISSION_MODES, DEFAULTS, SERVING_POLICIES
from tests.operator.crd_utils import EXAMPLE_PATH, admit, apply_defaults, load_crd, spec_schema

K8S_VERSION = "1.33.0"


def example_spec() -> dict:
    return yaml.safe_load(EXAMPLE_PATH.read_text())["spec"]


def test_crd_is_a_valid_kubernetes_object():
    kubernetes_validate.validate(load_crd(), K8S_VERSION, strict=True)


def test_crd_names_and_subresources():
    crd = load_crd()
    assert crd["spec"]["group"] == "dllm.dev" and crd["spec"]["names"]["plural"] == "dllmservices"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and "status" in version["subresources"]
    assert "scale" not in version["subresources"]  # kubectl scale would have changed replicas.min
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Phase", "Budget", "Replicas"}


@pytest.mark.parametrize("path", sorted(EXAMPLE_PATH.parent.glob("example-*.yaml")), ids=lambda p: p.name)
def test_examples_are_accepted(path):
    document = yaml.safe_load(path.read_text())
    assert document["kind"] == "DLLMService" and admit(document["spec"]) == []


def test_defaults_fill_an_almost_empty_spec():
    spec = apply_defaults({"model": {"uri": "GSAI-ML/LLaDA-8B-Instruct"}}, spec_schema(load_crd()))
    assert spec["model"]["family"] == "llada" and spec["redis"] == {"managed": True, "storage": "8Gi"}
    assert "blockLength" not in spec["decoding"] and "stepsPerBlock" not in spec["decoding"]  # the family's
    assert spec["replicas"] == {
        "min": 1,
        "max": 1,
        "targetQueueDepthPerReplica": 32,
        "scaleDownDelaySeconds": 300,
        "keda": False,
    }
    assert admit({"model": {"uri": "x"}}) == []


def _with(path: str, value) -> dict:
    spec = copy.deepcopy(example_spec())
    node = spec
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return spec


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("replicas.min", 5, "replicas.min must not exceed replicas.max"),
        (
            "profiling",
            {"enabled": True, "tokenBudget": 100000},
            "either profiling.enabled or profiling.tokenBudget",
        ),
        ("profiling", {"enabled": False}, "with profiling disabled, profiling.tokenBudget is required"),
        ("decoding.blockLength", 48, "decoding.blockLength must divide decoding.maxGenerationTokens"),
        ("profiling", {"tokenBudget": 100}, "must hold one request"),
        ("redis", {"managed": True, "url": "redis://r:6379/0"}, "exactly one"),
        ("redis", {}, "exactly one"),
        ("decoding.sparseCache", {"mode": "head-centric"}, "head-centric needs headImportanceConfigMap"),
    ],
)
def test_cel_rules_reject_bad_specs(path, value, message):
    failures = admit(_with(path, value))
    assert any(message in f for f in failures), failures


@pytest.mark.parametrize(
    "path, value",
    [
        ("model.family", "gpt2"),
        ("decoding.threshold", 0),
        ("decoding.cache", "paged"),
        ("resources.memory", "lots"),
        ("replicas.max", 0),
        ("gateway.serviceType", "Ingress"),
    ],
)
def test_schema_rejects_bad_values(path, value):
    assert admit(_with(path, value))


def test_budget_instead_of_profiling_is_accepted():
    assert admit(_with("profiling", {"tokenBudget": 200000})) == []
    assert admit(_with("redis", {"url": "redis://redis.example:6379/0"})) == []


INVALID = [
    ("resources.gpuResourceName", "gpu"),  # not domain-qualified: no such extended resource
    ("resources.gpuResourceName", "nvidia.com/"),
    ("resources.nodeSelector", {"gpu": "a100 80gb"}),  # a label value has no spaces
    ("resources.nodeSelector", {"k" * 317: "x"}),  # the key's form is the operator's to check
    ("resources.nodeSelector", {"gpu": "x" * 64}),
    ("resources.gpus", 1_000_000),
    ("resources.gpus", 2),  # one worker per pod uses one GPU: more would sit idle
    ("resources.gpus", -1),
    ("resources.memory", "0"),
    ("resources.memory", "0Gi"),
    ("resources.memory", "-1Gi"),
    ("resources.memory", "64 Gi"),
    ("resources.memory", "64GB"),
    ("resources.cpu", "0"),
    ("resources.cpu", "0m"),
    ("resources.cpu", "two"),
    ("decoding.stepsPerBlock", 64),  # more steps than tokens in a block
    ("decoding.threshold", 0),
    ("decoding.treshold", 0.8),  # a typo must not be pruned into the default
    ("redis", {"url": "redis://"}),
    ("redis", {"url": "redis://:hunter2@redis.queue:6379/0"}),  # the password goes in passwordSecretRef
    ("redis", {"url": "http://redis.queue:6379"}),
    ("redis", {"url": "redis://redis.queue:6379/0 "}),
    ("replica", {"min": 2}),  # spec.replica for spec.replicas
    ("model.famly", "dream"),
    ("gateway.prot", 8080),
    ("profiling.utilisation", 0.8),
    ("scheduling.maxWaitSeconds", -1),
    ("scheduling.batchWindowSeconds", 2),
    ("scheduling.maxRows", 0),
    ("scheduling.maxWait", 2),
    ("scheduling.batchMaxRows", -1),
    ("scheduling.batchMaxWaitSeconds", -5),
    ("scheduling.batchMaxLines", 4),
    ("scheduling.policy", "fifo"),
    ("scheduling.refreshQuota", 0),
    ("scheduling.refreshQuota", 1.5),
    ("scheduling.batchRefreshQuota", 0),
    ("scheduling.refreshInterval", -1),
    ("scheduling.refreshInterval", 1.5),
    ("scheduling.stepLevel", "no"),
    ("scheduling.cacheShare", 0),
    ("scheduling.cacheShare", 1.2),
    ("scheduling.prefillChunk", -1),
    ("scheduling.prefillChunk", 1.5),
    ("decoding.sparseCache", {"mode": "lossy"}),
    ("decoding.sparseCache", {"mode": "uniform", "retention": 0}),
    ("decoding.sparseCache", {"mode": "uniform", "retention": 1.5}),
    ("decoding.sparseCache", {"mode": "uniform", "minorRetention": 0.3}),
    ("decoding.sparseCache", {"mode": "uniform", "coreShare": -0.1}),
    ("decoding.sparseCache", {"mode": "uniform", "minorShare": 1.1}),
    ("decoding.sparseCache", {"mode": "uniform", "consistency": 2}),
    ("decoding.sparseCache", {"mode": "uniform", "scoring": "attention"}),
    ("decoding.sparseCache", {"mode": "uniform", "poolKernel": 4}),  # even
    ("decoding.sparseCache", {"mode": "uniform", "poolKernel": 17}),
    ("decoding.sparseCache", {"mode": "uniform", "selection": "all"}),
    ("decoding.sparseCache", {"mode": "uniform", "selectionDelay": -1}),
    ("decoding.sparseCache", {"mode": "uniform", "selectionDelay": 1.5}),
    ("decoding.sparseCache", {"mode": "uniform", "retension": 0.5}),  # a typo must not be pruned
    ("decoding.sparseCache", {"mode": "head-centric"}),  # no importance file
    ("decoding.sparseCache", {"mode": "head-centric", "headImportanceConfigMap": "Heads_JSON"}),
    ("decoding.maxMaterializedLogits", 0),
    ("decoding.logitCandidates", -1),
    ("decoding.warmPrefixes", [""]),
    ("decoding.warmPrefixes", "system:You are helpful."),  # a list, not one string
    ("decoding.warmPrefixes", ["x"] * 17),
    ("decoding.warmPrefix", ["system:You are helpful."]),
    ("decoding.batchInvariant", "yes"),
]


@pytest.mark.parametrize("path, value", INVALID, ids=[f"{p}={v!r}"[:60] for p, v in INVALID])
def test_invalid_specs_are_rejected(path, value):
    assert admit(_with(path, value)) != [], f"{path}={value!r} was admitted"


VALID = [
    ("resources.memory", "1e9"),
    ("resources.memory", "1Pi"),
    ("resources.memory", "68719476736"),
    ("resources.memory", "1.5Ti"),
    ("resources.cpu", "500m"),
    ("resources.cpu", "0.5"),
    ("resources.gpus", 0),
    ("resources.gpuResourceName", "amd.com/gpu"),
    ("resources.nodeSelector", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": ""}),
    ("redis", {"url": "rediss://redis.queue:6380/2"}),
    ("redis", {"url": "redis+cluster://redis-0.redis.queue:7000"}),
    ("decoding.stepsPerBlock", 32),
    ("scheduling.maxWaitSeconds", 0),
    ("scheduling.maxWaitSeconds", 2.5),
    ("scheduling.batchWindowSeconds", 0),
    ("scheduling.maxRows", 64),
    ("scheduling.batchMaxRows", 0),
    ("scheduling.batchMaxWaitSeconds", 600),
    ("scheduling.policy", "dllm-serve"),
    ("scheduling.refreshQuota", 1),
    ("scheduling.batchRefreshQuota", 0.05),
    ("scheduling.refreshInterval", 8),
    ("scheduling.stepLevel", False),
    ("scheduling.cacheShare", 0.35),
    ("scheduling.prefillChunk", 0),
    ("scheduling.prefillChunk", 256),
    ("scheduling.cacheShare", 1),
    ("decoding.sparseCache", {"mode": "off"}),
    ("decoding.sparseCache", {"mode": "uniform", "retention": 1}),
    (
        "decoding.sparseCache",
        {
            "mode": "head-centric",
            "retention": 0.4,
            "coreShare": 0.1,
            "minorShare": 0.3,
            "minorRetention": 0.2,
            "consistency": -1,
            "scoring": "mean-query-logit",
            "poolKernel": 3,
            "selection": "shared",
            "selectionDelay": 1,
            "headImportanceConfigMap": "llada-8b.heads",
        },
    ),
    ("decoding.maxMaterializedLogits", 1),
    ("decoding.logitCandidates", 0),
    ("decoding.logitCandidates", 64),
    ("decoding.warmPrefixes", ["system:You are helpful.", "prompt:system: is a prefix too"]),
    ("decoding.batchInvariant", True),
]


@pytest.mark.parametrize("path, value", VALID, ids=[f"{p}={v!r}"[:60] for p, v in VALID])
def test_valid_specs_are_accepted(path, value):
    assert admit(_with(path, value)) == []


def test_the_crd_scheduling_defaults_and_ranges_are_the_scheduler_configs():
    """One home for BlockServe's settings: the CRD repeats SchedulerConfig's defaults (a schema cannot
    import them), and this keeps the two the same."""
    fields = spec_schema(load_crd())["properties"]["scheduling"]["properties"]
    defaulted = {name: crd for name, crd in SCHEDULING_FIELDS.items() if name not in UNSET_BY_DEFAULT}
    assert {crd: fields[crd]["default"] for crd in defaulted.values()} == {
        crd: getattr(DEFAULTS, name) for name, crd in defaulted.items()
    }
    assert fields["admission"]["enum"] == list(ADMISSION_MODES)
    assert fields["policy"]["enum"] == list(SERVING_POLICIES)
    assert fields["policy"]["default"] == SERVING_POLICIES[0]
    assert set(fields) == {"policy", *SCHEDULING_FIELDS.values()}
    # absent, the engines take the profile's measure: a default would hide it
    assert all("default" not in fields[SCHEDULING_FIELDS[name]] for name in UNSET_BY_DEFAULT)
    defaults = apply_defaults({"model": {"uri": "x"}}, spec_schema(load_crd()))["scheduling"]
    assert defaults["policy"] == "blockserve" and "cacheShare" not in defaults


def test_the_crd_decoding_options_ranges_are_the_engines():
    """The head-sparse cache's modes and ranges are HeadSparseConfig's (the CRD repeats them, and the
    operator names them under spec.decoding)."""
    decoding = spec_schema(load_crd())["properties"]["decoding"]["properties"]
    sparse = decoding["sparseCache"]["properties"]
    assert sparse["mode"]["enum"] == list(MODES)
    assert set(sparse) == {*SPARSE_FIELDS.values(), "headImportanceConfigMap"}
    assert sparse["minorRetention"]["maximum"] == MAX_MINOR_RETENTION
    assert {*LOGIT_FIELDS.values(), "sparseCache", "warmPrefixes"} <= set(decoding)
    assert not any("default" in field for field in sparse.values())  # absent: the worker's defaults
    assert "sparseCache" not in apply_defaults({"model": {"uri": "x"}}, spec_schema(load_crd()))["decoding"]


@pytest.mark.parametrize("family", FAMILY_DECODING)
def test_the_crd_and_the_operator_take_a_familys_decoding_defaults_from_the_contracts(family):
    """blockLength and stepsPerBlock default per family: the CRD's CEL rules repeat
    dllm_contracts/families.py's numbers, and the operator fills them from there."""
    block, steps = FAMILY_DECODING[family].block_length, FAMILY_DECODING[family].steps_per_block

    def spec(**decoding) -> dict:
        return {"model": {"uri": "x", "family": family}, "decoding": decoding}

    def refused(message: str, **decoding) -> bool:
        return any(message in failure for failure in admit(spec(**decoding)))

    assert admit(spec(maxGenerationTokens=2 * block)) == []
    assert admit(spec(blockLength=steps, maxGenerationTokens=2 * steps)) == []  # the steps default fits
    assert admit(spec(stepsPerBlock=block, maxGenerationTokens=block)) == []  # so does the block default
    assert refused("decoding.blockLength must divide", maxGenerationTokens=2 * block + 1)
    assert refused("stepsPerBlock must not exceed", blockLength=steps - 1, maxGenerationTokens=2 * steps - 2)
    assert refused("stepsPerBlock must not exceed", stepsPerBlock=block + 1, maxGenerationTokens=2 * block)
    parsed = parse_spec("s", "default", spec(maxGenerationTokens=2 * block))
    assert (parsed.block_length, parsed.steps_per_block) == (block, steps)


def test_diffusion_gemmas_defaults_are_its_checkpoints():
    """Its block is the reference config's canvas, its steps the reference generation config's."""
    from engine_pod.families.diffusion_gemma.config import TOP_DEFAULTS
    from engine_pod.families.diffusion_gemma.sampler_settings import DEFAULT_MAX_DENOISING_STEPS

    defaults = FAMILY_DECODING["diffusion_gemma"]
    assert (defaults.block_length, defaults.steps_per_block) == (
        TOP_DEFAULTS["canvas_length"],
        DEFAULT_MAX_DENOISING_STEPS,
    )


def test_the_families_the_crd_and_the_chart_accept_are_the_engines():
    """One list of model families: the engine's registry (engine_pod/families/registry.py) is what the CRD,
    the chart's values schema and default, dllm_contracts and the operator's default accept."""
    from dllm_operator.config import OperatorSettings

    from engine_pod.families.registry import family_names

    families = family_names()
    spec = spec_schema(load_crd())["properties"]
    assert spec["model"]["properties"]["family"]["enum"] == list(families)
    assert spec["model"]["properties"]["family"]["default"] == families[0]
    chart = Path(__file__).resolve().parents[2] / "charts" / "dllm-operator"
    schema = json.loads((chart / "values.schema.json").read_text())
    assert schema["properties"]["supportedFamilies"]["items"]["enum"] == list(families)
    assert schema["properties"]["example"]["properties"]["family"]["enum"] == list(families)
    assert yaml.safe_load((chart / "values.yaml").read_text())["supportedFamilies"] == list(families)
    assert OperatorSettings().supported_families == families == tuple(FAMILY_DECODING)
