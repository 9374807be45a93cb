#!/usr/bin/env bash
# Build the three images (operator, engine, gateway) from the tested set, tag them for a registry, and
# optionally push them; then print the `helm install` line that runs them.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
Usage: scripts/build-images.sh --registry REGISTRY [--tag TAG] [--push] [--torch-index URL]

Builds, with docker or podman (whichever is installed):
  REGISTRY/dllm-operator:TAG   docker/operator.Dockerfile   kopf run -m dllm_operator (no torch)
  REGISTRY/dllm-engine:TAG     docker/engine.Dockerfile     dllm worker / dllm profile (CUDA torch)
  REGISTRY/dllm-gateway:TAG    docker/gateway.Dockerfile    python -m gateway (no torch)
Every package at the version constraints.txt pins (tests/images checks the Dockerfiles against it).

Options:
  --registry REGISTRY  where the images go, e.g. ghcr.io/you or registry.example.com:5000/dllm (required)
  --tag TAG            image tag (default: the chart's appVersion, charts/dllm-operator/Chart.yaml)
  --push               push the images after building them (log in to the registry first)
  --torch-index URL    the PyTorch wheel index for the engine (default: the CUDA 12.8 builds,
                       https://download.pytorch.org/whl/cu128; match it to your nodes' driver)
  -h, --help           this text
EOF
}

registry="" tag="" push=0 torch_index=""
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry=${2:?--registry needs a value}; shift 2 ;;
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --push) push=1; shift ;;
    --torch-index) torch_index=${2:?--torch-index needs a value}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$registry" ] || { echo "build-images.sh: --registry is required (see --help)" >&2; exit 2; }
registry=${registry%/}
[ -n "$tag" ] || tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/dllm-operator/Chart.yaml)

if command -v docker >/dev/null 2>&1; then engine=docker
elif command -v podman >/dev/null 2>&1; then engine=podman
else echo "build-images.sh: neither docker nor podman is installed" >&2; exit 2
fi

torch_version=$(sed -n 's/^torch==//p' constraints.txt)
for image in operator engine gateway; do
  args=(build -f "docker/$image.Dockerfile" -t "$registry/dllm-$image:$tag")
  if [ "$image" = engine ]; then
    args+=(--build-arg "TORCH_VERSION=$torch_version")
    [ -n "$torch_index" ] && args+=(--build-arg "TORCH_INDEX=$torch_index")
  fi
  echo "== $engine ${args[*]} ."
  "$engine" "${args[@]}" .
done

if [ "$push" = 1 ]; then
  for image in operator engine gateway; do
    echo "== $engine push $registry/dllm-$image:$tag"
    "$engine" push "$registry/dllm-$image:$tag"
  done
fi

cat <<EOF

Images built: $registry/dllm-{operator,engine,gateway}:$tag$([ "$push" = 1 ] && echo " (pushed)")
Install the operator with them:

  helm install dllm charts/dllm-operator --namespace dllm-system --create-namespace \\
    --set image.registry=$registry --set image.tag=$tag
EOF
