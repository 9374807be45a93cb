#!/usr/bin/env bash
# Every figure in docs/benchmarks.md, on this machine (CPU, the shipped model, 2 threads).
# Results go to docs/results/: JSON reports and PNG plots. Takes about 30 minutes on 2 cores, and 25 more
# for the DiffusionGemma figures (1d).
# Usage: bash scripts/reproduce-benchmarks.sh   (environment: LIMIT, the memory limit profiled; PORT, 8411)
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p;}' "$0"; exit 0 ;; esac
[ $# -eq 0 ] || { echo "reproduce-benchmarks.sh: unknown argument $1 (see --help)" >&2; exit 2; }
cd "$(dirname "$0")/.."
out=docs/results
mkdir -p "$out"

# 1. Scheduling policies side by side on the shipped workloads (equal memory: static's batch size is
#    the largest whose boxes fit BlockServe's token budget), BlockServe packed (default) and dense, plus
#    the whole serving path with each scheduler behind it; seven rounds, each policy's median run reported.
for workload in heterogeneous homogeneous; do
  dllm bench --workload "$workload" --repeat 7 \
    --policy sequential,static,blockserve,blockserve-dense,blockserve-projected,gateway,gateway-static,gateway-sequential \
    --json "$out/bench-$workload.json" --plot "$out/bench-$workload.png"
done

# 1b. Where a block cycle's time goes (59 rows of 138 tokens, and 59 rows of 7-138), packed and dense.
for layout in packed dense; do
  for shape in "" "--mixed"; do
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python scripts/cycle_profile.py --layout "$layout" $shape
  done
done > "$out/cycle-profile.txt" 2>/dev/null

# 1c. A block-diffusion model (the LLaDA2.0 architecture, random weights, the threshold calibrated so
#     that blocks can finish early): BlockServe against static batching at equal memory, then the same
#     model profiled and run at its budget.
dllm bench --model random:llada2-tiny --workload heterogeneous --repeat 3 --calibrate-threshold 0.5 \
  --policy sequential,static,blockserve,blockserve-dense --json "$out/bench-llada2.json" \
  --plot "$out/bench-llada2.png"
dllm profile --model random:llada2-tiny --memory-limit "${LIMIT:-480M}" --json "$out/profile-llada2.json"
dllm bench --model random:llada2-tiny --workload heterogeneous --policy static,blockserve --repeat 3 \
  --calibrate-threshold 0.5 --profile "$out/profile-llada2.json" --json "$out/bench-llada2-profiled.json"

# 1d. DiffusionGemma (a random model of its layout, whose canvases settle each at its own step):
#     BlockServe against static batching at the budget the profiler plans for a 600 MiB limit, the
#     engine on one core (its sampler's draws and its encoder weigh as much as the forwards there).
dllm profile --model random:diffusion-gemma-tiny --memory-limit 600M --max-tokens 4096 \
  --json "$out/profile-diffusion-gemma-600M.json"
for n in 128 64; do
  name=bench-diffusion-gemma; [ "$n" = 64 ] && name=bench-diffusion-gemma-64
  dllm bench --model random:diffusion-gemma-tiny --workload "synthetic:n=$n,prompt=8-256,gen=32-256,seed=0" \
    --policy blockserve,static --profile "$out/profile-diffusion-gemma-600M.json" --repeat 5 --pin \
    --no-margins --json "$out/$name.json" --plot "$out/$name.png"
done

# 2. The profiled budget is safe and tight: BlockServe at the budget stays under the limit, at twice
#    the budget it does not. The limit is small enough that the workload can fill twice the budget, and
#    the padding rule is off so that admission is limited by the token budget alone.
limit=${LIMIT:-360M}
dllm profile --memory-limit "$limit" --json "$out/profile.json"
budget=$(python -c "import json; print(json.load(open('$out/profile.json'))['token_budget'])")
for factor in 1 2; do
  dllm bench --workload heterogeneous --policy blockserve --min-padding-efficiency 0 \
    --token-budget "$((factor * budget))" --json "$out/budget-${factor}x.json"
done

# 2b. Packed against dense at the same memory limit: each layout profiled, then BlockServe at its own
#     budget (concurrent requests admitted, and the measured peak against the limit).
for layout in packed dense; do
  policy=blockserve; [ "$layout" = dense ] && policy=blockserve-dense
  dllm profile --memory-limit "$limit" --layout "$layout" --json "$out/profile-$layout.json"
  dllm bench --workload heterogeneous --policy "$policy" --layout "$layout" --min-padding-efficiency 0 \
    --profile "$out/profile-$layout.json" --json "$out/layout-$layout.json"
done

# 3. Online load: Poisson arrivals at several rates, every policy on the same arrivals; then the
#    fairness load (300 chat requests, 32 clients) through dllm serve.
dllm bench --workload heterogeneous --policy sequential,static,blockserve,gateway,gateway-static,gateway-sequential \
  --arrival-rate 10,30,60,120 \
  --requests 200 --json "$out/online-heterogeneous.json" --plot "$out/online-heterogeneous.png"
port=${PORT:-8411}
dllm serve --port "$port" --data-dir "$(mktemp -d)" > "$out/serve.log" 2>&1 &
serve_pid=$!
trap 'kill -INT $serve_pid 2>/dev/null || true' EXIT
until grep -q "API at" "$out/serve.log"; do sleep 1; done
dllm bench --url "http://127.0.0.1:$port" --concurrency 32 --requests 300 --served-model-name tiny-llada \
  --json "$out/load-c32-1.json"
kill -INT $serve_pid && wait $serve_pid || true

# 4. Generation quality of the shipped model under every policy.
dllm eval --policy sequential,static,blockserve --n 210 --json --outputs "$out/eval-outputs.jsonl" > "$out/eval.json"

# 4b. The gateway's CPU per request and requests per second, one process and two.
for processes in 1 2; do
  PYTHONPATH=. python scripts/gateway_cost.py --requests 512 --bursts 7 --processes "$processes" \
    > "$out/gateway-cost-$processes.txt" 2>&1
done

# 5. The tables docs/benchmarks.md quotes.
python scripts/results_tables.py "$out" > "$out/tables.md"   # docs/benchmarks.md quotes these
