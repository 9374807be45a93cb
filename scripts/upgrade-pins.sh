#!/usr/bin/env bash
# Upgrade the pinned dependency set on purpose: resolve the newest releases that pyproject.toml's ranges
# allow in a brand-new virtual environment, run the whole test suite on them, and only if it passes,
# rewrite constraints.txt. On failure the candidate set is left in constraints.candidate.txt and the
# exit status is the suite's, so you can see what a new release broke (then tighten a range or fix it).
# Usage: bash scripts/upgrade-pins.sh   (about 10 minutes on 2 cores)
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p;}' "$0"; exit 0 ;; esac
[ $# -eq 0 ] || { echo "upgrade-pins.sh: unknown argument $1 (see --help)" >&2; exit 2; }
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
python -m pip install --quiet torch==2.13.0          # the CPU wheel first, so nothing pulls a CUDA build
python -m pip install --quiet -e ".[dev,mutation]"    # no constraints: the newest the ranges allow
{
  sed -n '1,/^[^#]/{/^#/p}' constraints.txt
  python -m pip freeze --exclude-editable | sed 's/+cpu$//'
} >constraints.candidate.txt
bash .ci/get-helm.sh .tools

if python -m pytest -q; then
  mv constraints.candidate.txt constraints.txt
  echo "upgrade-pins: suite passed; constraints.txt rewritten (review it with git diff, then commit)"
else
  status=$?
  echo "upgrade-pins: suite failed on the new set; constraints.txt unchanged, candidate in constraints.candidate.txt" >&2
  exit "$status"
fi
