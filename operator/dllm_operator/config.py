"""Operator settings: images and intervals, read from the environment only here."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSettings:
    engine_image: str = "ghcr.io/dllm-dev/dllm-engine:0.1.0"
    gateway_image: str = "ghcr.io/dllm-dev/dllm-gateway:0.1.0"
    redis_image: str = "redis:7.2-alpine"
    supported_families: tuple[str, ...] = ("llada", "dream", "llada2", "sdar")
    resync_seconds: float = 15.0  # timer period: progress checks and autoscaling
    api_url: str | None = (
        None  # talk to this API server (tests: the kmock emulator); else in-cluster/kubeconfig
    )
    image_pull_policy: str = "IfNotPresent"
    operator_namespace: str = ""  # where the operator runs (managed Redis admits its pods)
    operator_app: str = "dllm-operator"  # the operator pods' app.kubernetes.io/name

    @classmethod
    def from_env(cls) -> OperatorSettings:
        env = os.environ
        families = tuple(
            f.strip()
            for f in env.get("DLLM_SUPPORTED_FAMILIES", ",".join(cls.supported_families)).split(",")
            if f.strip()
        )
        return cls(
            engine_image=env.get("DLLM_ENGINE_IMAGE", cls.engine_image),
            gateway_image=env.get("DLLM_GATEWAY_IMAGE", cls.gateway_image),
            redis_image=env.get("DLLM_REDIS_IMAGE", cls.redis_image),
            supported_families=families,
            resync_seconds=float(env.get("DLLM_OPERATOR_RESYNC_S", cls.resync_seconds)),
            api_url=env.get("DLLM_K8S_API_URL") or None,
            image_pull_policy=env.get("DLLM_IMAGE_PULL_POLICY", cls.image_pull_policy),
            operator_namespace=env.get("DLLM_OPERATOR_NAMESPACE", cls.operator_namespace),
            operator_app=env.get("DLLM_OPERATOR_APP", cls.operator_app),
        )


GROUP, VERSION, PLURAL, KIND = "dllm.dev", "v1alpha1", "dllmservices", "DLLMService"
