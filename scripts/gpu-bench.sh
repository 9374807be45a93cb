#!/usr/bin/env bash
# One prepared GPU run (about 10 minutes on one H200): profile a randomly initialised model of the real
# LLaDA-8B shape in bfloat16, then benchmark static batching against BlockServe at the profiled budget.
# Random weights never emit EOS, so requests end at their own budgets: the synthetic workload varies both
# prompt lengths and generation budgets. Results land in runs/gpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/gpu
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
dllm profile --model random:llada-8b --device cuda --dtype bfloat16 --utilization 0.9 --max-tokens 65536 \
  --json "$out/profile.json"
dllm bench --model random:llada-8b --device cuda --dtype bfloat16 --profile "$out/profile.json" \
  --workload "synthetic:n=256,prompt=32-1024,gen=32-512,seed=0" --policy static,blockserve \
  --no-isolate --no-margins --json "$out/bench.json" --plot "$out/bench.png"
python - "$out/bench.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
for name, m in report["policies"].items():
    print(name, m["tokens_per_s"], m.get("speedup_vs_static"), m["padding_efficiency"], m["peak_memory_bytes"])
PY
