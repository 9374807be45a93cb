#!/usr/bin/env bash
# End to end on a real cluster: build the three images, install the chart, deploy the shipped model on
# CPU, wait for Ready, and ask it for a completion. Needs docker, kind (or k3d), kubectl and helm.
#   scripts/k8s-e2e.sh            # creates a kind cluster named dllm
#   CLUSTER=existing scripts/k8s-e2e.sh   # uses the current kubectl context instead
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${TAG:-0.1.0}
HELM=${HELM:-helm}

if [ -z "${CLUSTER:-}" ]; then
  kind get clusters | grep -qx dllm || kind create cluster --name dllm
fi
for component in engine gateway operator; do
  docker build -f "docker/$component.Dockerfile" -t "ghcr.io/dllm-dev/dllm-$component:$TAG" .
  [ -z "${CLUSTER:-}" ] && kind load docker-image --name dllm "ghcr.io/dllm-dev/dllm-$component:$TAG"
done

"$HELM" upgrade --install dllm charts/dllm-operator --namespace dllm-system --create-namespace \
  --set image.tag="$TAG" --set image.pullPolicy=IfNotPresent \
  --set engineImage="ghcr.io/dllm-dev/dllm-engine:$TAG" --set gatewayImage="ghcr.io/dllm-dev/dllm-gateway:$TAG" \
  --wait
kubectl apply -f crds/example-cpu-dllmservice.yaml
kubectl wait dllmservice/tiny --for=condition=Profiled --timeout=15m
kubectl wait dllmservice/tiny --for=condition=Ready --timeout=15m
kubectl get dllmservice tiny

kubectl port-forward svc/tiny 8000:80 >/dev/null 2>&1 &
forward=$!
trap 'kill $forward' EXIT
sleep 3
curl -sf http://127.0.0.1:8000/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model": "tiny-llada", "messages": [{"role": "user", "content": "count to 9 ."}]}'
echo
