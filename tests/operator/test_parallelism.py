"""spec.parallelism: the CRD's rules, the operator's checks, and what it renders for a model larger than one
GPU: one group of 4 ranks per pod (a Deployment), and groups of 8 ranks over 2 nodes (a LeaderWorkerSet)."""

from __future__ import annotations

import re

import pytest
import yaml
from dllm_operator.config import OperatorSettings
from dllm_operator.manifests.engine import EnginePods
from dllm_operator.manifests.engine_group import engine_workload
from dllm_operator.manifests.keda import scaled_object
from dllm_operator.manifests.redis import managed_redis_url
from dllm_operator.parallelism import GROUP_PORT, Parallelism
from dllm_operator.profile_state import profile_hash_of
from dllm_operator.spec import SpecError, parse_spec

from engine_pod.cli.main import build_parser
from tests.operator.crd_utils import EXAMPLE_PATH, ROOT, admit, apply_defaults, load_crd, spec_schema
from tests.operator.lws_schema import validate_group_set
from tests.operator.test_manifests import OWNER, all_manifests, validate

LEADER = "llada-8b-engine-0.llada-8b-engine.default"  # what LWS_LEADER_ADDRESS holds for group 0


def example_spec(**parallelism) -> dict:
    spec = yaml.safe_load(EXAMPLE_PATH.read_text())["spec"]
    if parallelism:
        spec["parallelism"] = parallelism
    if parallelism.get("nodes", 1) > 1:
        spec["profiling"] = {"tokenBudget": 200_000}
    return spec


def parsed(**parallelism):
    return parse_spec("llada-8b", "default", example_spec(**parallelism))


def expanded(command: list[str], worker_index: int) -> list[str]:
    """The command as the kubelet runs it: $(VAR) replaced by the variables LWS sets in the container."""
    variables = {"LWS_LEADER_ADDRESS": LEADER, "LWS_WORKER_INDEX": str(worker_index)}
    for name, value in variables.items():
        command = [part.replace(f"$({name})", value) for part in command]
    return command


def parse_command(command: list[str]):
    assert command[:2] == ["dllm", "worker"] or command[:2] == ["dllm", "profile"]
    return build_parser().parse_args(command[1:])


def container(pod_spec: dict) -> dict:
    return pod_spec["containers"][0]


def shm(pod_spec: dict) -> tuple[dict | None, dict | None]:
    volume = next((v for v in pod_spec["volumes"] if v["name"] == "shm"), None)
    mount = next((m for m in container(pod_spec)["volumeMounts"] if m["name"] == "shm"), None)
    return volume, mount


def test_the_crd_defaults_are_the_operators():
    defaults = apply_defaults({"model": {"uri": "x"}}, spec_schema(load_crd()))["parallelism"]
    assert defaults == {
        "tensor": Parallelism.tensor,
        "nodes": Parallelism.nodes,
        "expert": Parallelism.expert,
    }
    assert parse_spec("s", "default", {"model": {"uri": "x"}}).parallelism == Parallelism()


@pytest.mark.parametrize(
    ("parallelism", "budget", "message"),
    [
        ({"tensor": 6, "nodes": 4}, 200_000, "parallelism.tensor must be a multiple of parallelism.nodes"),
        ({"tensor": 8, "nodes": 2}, None, "parallelism.nodes above 1 needs profiling.tokenBudget"),
    ],
)
def test_combinations_the_crd_rejects_the_operator_refuses_too(parallelism, budget, message):
    spec = example_spec() | {"parallelism": parallelism}
    if budget:
        spec["profiling"] = {"tokenBudget": budget}
    assert any(message in failure for failure in admit(spec)), admit(spec)
    with pytest.raises(SpecError, match=message):
        parse_spec("llada-8b", "default", spec)


@pytest.mark.parametrize(
    "parallelism", [{"tensor": 0}, {"nodes": 0}, {"tensor": 128}, {"tensor": 4, "pipeline": 2}]
)
def test_the_schema_rejects_bad_sizes_and_unknown_fields(parallelism):
    assert admit(example_spec() | {"parallelism": parallelism})


def test_tensor_four_on_one_node_and_eight_over_two_are_admitted():
    assert admit(example_spec(tensor=4)) == []
    assert admit(example_spec(tensor=8, nodes=2)) == []


def test_a_single_rank_renders_as_before():
    spec = parsed()
    manifests = all_manifests(spec)
    job, engine = (manifests[i]["spec"]["template"]["spec"] for i in (0, 2))
    for pod in (job, engine):
        assert shm(pod) == (None, None)
        assert "--tensor-parallel" not in container(pod)["command"]
        assert container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert profile_hash_of(spec, "img") == profile_hash_of(
        parse_spec("llada-8b", "default", example_spec()), "img"
    )


def test_four_ranks_on_one_node_run_in_a_deployment_pod_with_four_gpus_and_shared_memory():
    spec = parsed(tensor=4)
    manifests = all_manifests(spec)
    for manifest in manifests:
        validate(manifest)
    job, engine = manifests[0]["spec"]["template"]["spec"], manifests[2]["spec"]["template"]["spec"]
    assert manifests[2]["kind"] == "Deployment"
    for pod in (job, engine):  # the profile measures at the size the engine runs at
        assert parse_command(container(pod)["command"]).tensor_parallel == 4
        assert container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "4"
        volume, mount = shm(pod)
        assert volume == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}
        assert mount == {"name": "shm", "mountPath": "/dev/shm"}
    assert profile_hash_of(spec, "img") != profile_hash_of(parsed(), "img")  # a new size is profiled again


def test_cpu_ranks_request_no_gpu_but_share_memory():
    spec = parse_spec("llada-8b", "default", example_spec(tensor=2) | {"resources": {"gpus": 0}})
    engine = all_manifests(spec)[2]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in container(engine)["resources"]["limits"]
    assert parse_command(container(engine)["command"]).device == "cpu"
    assert shm(engine)[0]["emptyDir"]["sizeLimit"] == "2Gi"


def test_eight_ranks_over_two_nodes_render_a_leader_worker_set_lws_accepts():
    spec = parsed(tensor=8, nodes=2)
    settings = OperatorSettings(operator_namespace="dllm-system")
    group_set = engine_workload(
        spec, OWNER, EnginePods(settings, managed_redis_url(spec), "abc", "NVIDIA-H100"), 2
    )
    validate_group_set(group_set)
    assert (group_set["apiVersion"], group_set["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    group = group_set["spec"]["leaderWorkerTemplate"]
    assert group_set["spec"]["replicas"] == 2 and group["size"] == 2
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = group["leaderTemplate"]["spec"], group["workerTemplate"]["spec"]
    for index, pod in enumerate((leader, worker)):
        args = parse_command(expanded(container(pod)["command"], worker_index=index))
        assert (args.tensor_parallel, args.nodes, args.node_rank) == (8, 2, index)
        assert args.group_address == f"{LEADER}:{GROUP_PORT}"
        assert container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "4"  # 8 ranks / 2 nodes
        assert shm(pod)[0]["emptyDir"]["sizeLimit"] == "4Gi"
        assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100"
    assert "--node-rank" in container(leader)["command"]
    assert container(leader)["command"][container(leader)["command"].index("--node-rank") + 1] == "0"
    assert "readinessProbe" in container(leader) and "readinessProbe" not in container(worker)
    assert {"name": "group", "containerPort": GROUP_PORT} in container(leader)["ports"]
    labels = group["leaderTemplate"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "engine" and labels["dllm.dev/group-role"] == "leader"


def test_keda_scales_the_leader_worker_set_by_whole_groups():
    spec = parse_spec(
        "llada-8b", "default", example_spec(tensor=8, nodes=2) | {"replicas": {"keda": True, "max": 3}}
    )
    target = scaled_object(spec, OWNER, managed_redis_url(spec))["spec"]["scaleTargetRef"]
    assert target == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "llada-8b-engine",
    }
    single = scaled_object(parsed(tensor=4), OWNER, "redis://r:6379/0")["spec"]["scaleTargetRef"]
    assert single == {"name": "llada-8b-engine"}


def test_the_documented_services_are_admitted_and_render_what_the_guide_says():
    guide = (ROOT / "docs" / "kubernetes.md").read_text()
    section = guide[guide.index("## Models larger than one GPU") :].split("\n## ", 1)[0]
    services = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]
    assert [s["spec"]["parallelism"] for s in services] == [
        {"tensor": 4},
        {"tensor": 8, "nodes": 2},
        {"tensor": 4, "expert": 4},
    ]
    for service in services:
        assert admit(service["spec"]) == []
        spec = parse_spec(service["metadata"]["name"], "default", service["spec"])
        assert f"nvidia.com/gpu: {spec.parallelism.ranks_per_pod}" in section
        assert f"sizeLimit: {spec.parallelism.shm_size()}" in section or spec.parallelism.multi_node


def _llada2(**parallelism) -> dict:
    spec = example_spec(**parallelism)
    spec["model"] = {"uri": "inclusionAI/LLaDA2.0-mini", "family": "llada2"}
    return spec


@pytest.mark.parametrize(
    ("parallelism", "message"),
    [
        ({"tensor": 2, "expert": 4}, "parallelism.expert must divide parallelism.tensor"),
        ({"expert": 6, "nodes": 4}, "parallelism.tensor must be a multiple of parallelism.nodes"),
    ],
)
def test_expert_sizes_the_crd_rejects_the_operator_refuses_too(parallelism, message):
    spec = _llada2() | {"parallelism": parallelism}
    if parallelism.get("nodes", 1) > 1:
        spec["profiling"] = {"tokenBudget": 200_000}
    assert any(message in failure for failure in admit(spec)), admit(spec)
    with pytest.raises(SpecError, match=message):
        parse_spec("llada2", "default", spec)


def test_a_family_without_experts_is_refused_expert_parallelism_by_the_crd_and_the_operator():
    spec = example_spec(expert=2)  # the example is LLaDA
    message = "parallelism.expert above 1 needs a mixture-of-experts family (llada2, diffusion_gemma)"
    assert any(message in failure for failure in admit(spec)), admit(spec)
    with pytest.raises(SpecError, match=r"needs a mixture-of-experts family .*llada has no experts"):
        parse_spec("llada-8b", "default", spec)


@pytest.mark.parametrize(
    ("parallelism", "ranks_per_pod"),
    [({"expert": 4}, 4), ({"tensor": 4, "expert": 2}, 4), ({"expert": 2}, 2)],
)
def test_expert_parallelism_renders_its_flag_and_sizes_the_pods_by_the_groups_ranks(
    parallelism, ranks_per_pod
):
    spec = parse_spec("llada2", "default", _llada2(**parallelism))
    assert admit(_llada2(**parallelism)) == []
    manifests = all_manifests(spec)
    for manifest in manifests:
        validate(manifest)
    job, engine = manifests[0]["spec"]["template"]["spec"], manifests[2]["spec"]["template"]["spec"]
    for pod in (job, engine):  # the profile measures at the size the engine runs at
        args = parse_command(container(pod)["command"])
        assert (args.tensor_parallel, args.expert_parallel) == (
            parallelism.get("tensor", 1),
            parallelism["expert"],
        )
        assert container(pod)["resources"]["limits"]["nvidia.com/gpu"] == str(ranks_per_pod)
        assert shm(pod)[0]["emptyDir"]["sizeLimit"] == f"{ranks_per_pod}Gi"
    others = {
        profile_hash_of(parse_spec("llada2", "default", _llada2(**p)), "img") for p in ({}, {"tensor": 4})
    }
    assert profile_hash_of(spec, "img") not in others  # another group size is profiled again


def test_experts_over_two_nodes_render_a_leader_worker_set_of_their_ranks():
    spec = parse_spec("llada2", "default", _llada2(expert=8, nodes=2))
    settings = OperatorSettings(operator_namespace="dllm-system")
    group_set = engine_workload(spec, OWNER, EnginePods(settings, managed_redis_url(spec), "abc", None), 1)
    validate_group_set(group_set)
    group = group_set["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2
    for index, role in enumerate(("leaderTemplate", "workerTemplate")):
        pod = group[role]["spec"]
        args = parse_command(expanded(container(pod)["command"], worker_index=index))
        assert (args.tensor_parallel, args.expert_parallel, args.nodes) == (1, 8, 2)
        assert container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "4"
