#!/usr/bin/env bash
# End to end on a real cluster: build the three images, install the chart, deploy the shipped model on
# CPU, wait for Ready, and ask it for a completion. Needs docker (or podman), kind, kubectl and helm.
#   scripts/k8s-e2e.sh                    # creates a kind cluster named dllm, loads the images into it
#   CLUSTER=existing REGISTRY=registry.example.com/dllm scripts/k8s-e2e.sh
#                                         # the current kubectl context; images pushed to REGISTRY
# Usage: bash scripts/k8s-e2e.sh   (settings from the environment: CLUSTER, REGISTRY, TAG, HELM)
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p;}' "$0"; exit 0 ;; esac
[ $# -eq 0 ] || { echo "k8s-e2e.sh: unknown argument $1 (see --help)" >&2; exit 2; }
cd "$(dirname "$0")/.."
TAG=${TAG:-0.1.0}
REGISTRY=${REGISTRY:-ghcr.io/dllm-dev}
HELM=${HELM:-helm}
CPU_TORCH=https://download.pytorch.org/whl/cpu  # the CPU build of the pinned torch: no GPU on kind

if [ -z "${CLUSTER:-}" ]; then
  kind get clusters | grep -qx dllm || kind create cluster --name dllm
  bash scripts/build-images.sh --registry "$REGISTRY" --tag "$TAG" --torch-index "$CPU_TORCH"
  for component in operator engine gateway; do
    kind load docker-image --name dllm "$REGISTRY/dllm-$component:$TAG"
  done
else
  bash scripts/build-images.sh --registry "$REGISTRY" --tag "$TAG" --torch-index "$CPU_TORCH" --push
fi

"$HELM" upgrade --install dllm charts/dllm-operator --namespace dllm-system --create-namespace \
  --set image.registry="$REGISTRY" --set-string image.tag="$TAG" --wait
kubectl apply -f crds/example-cpu-dllmservice.yaml
kubectl wait dllmservice/tiny --for=condition=Profiled --timeout=15m
kubectl wait dllmservice/tiny --for=condition=Ready --timeout=15m
kubectl get dllmservice tiny

kubectl port-forward svc/tiny 8000:80 >/dev/null 2>&1 &
forward=$!
trap 'kill $forward' EXIT
for _ in $(seq 60); do curl -sf http://127.0.0.1:8000/healthz >/dev/null && break; sleep 1; done
curl -sf http://127.0.0.1:8000/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model": "tiny-llada", "messages": [{"role": "user", "content": "count to 9 ."}]}'
echo
