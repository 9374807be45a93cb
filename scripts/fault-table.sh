#!/usr/bin/env bash
# Run the fault-injection tests (real redis-server, `python -m gateway`, two `dllm worker` processes,
# 200 requests per case) and print their counts as the table in docs/benchmarks.md. About a minute on 2 cores.
# Usage: bash scripts/fault-table.sh
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p;}' "$0"; exit 0 ;; esac
[ $# -eq 0 ] || { echo "fault-table.sh: unknown argument $1 (see --help)" >&2; exit 2; }
cd "$(dirname "$0")/.."
report=$(mktemp)
trap 'rm -f "$report"' EXIT
DLLM_FAULT_REPORT="$report" python -m pytest -q -m "" tests/serving/test_outages.py  # every case, slow ones too
python - "$report" <<'PY'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
columns = ["sent", "completed", "lost", "duplicated", "5xx"]
print("| case | " + " | ".join(columns) + " |")
print("|---|" + "---|" * len(columns))
for row in sorted(rows, key=lambda r: r["case"]):
    if "lost" in row:
        print(f"| {row['case']} | " + " | ".join(str(row[c]) for c in columns) + " |")
for row in rows:
    if "streams_opened" in row:
        print(
            f"\n{row['case']}: {row['sent']} streams sent, {row['streams_opened']} opened, "
            f"{row['completed']} completed, {row['ended_with_error_and_done']} ended with an error event "
            f"and [DONE], {row['5xx']} answered 5xx; none was cut off."
        )
PY
