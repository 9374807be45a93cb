#!/usr/bin/env bash
# The prepared GPU run, sized for a short lease (about 6 minutes on one H200; see docs/benchmarks.md, "GPU").
#
# Needs only torch, safetensors, tokenizers/transformers, numpy, tqdm and matplotlib: the project is
# not installed, it runs from the working tree (PYTHONPATH=.). Steps, each writing its result as soon
# as it exists:
#   1. device.txt    GPU name and memory, torch and CUDA versions
#   2. profile.json  `dllm profile` of a random model of the real LLaDA-8B shape in bfloat16, weights
#                    initialised on the device; peak = reserved memory (expandable segments), usable =
#                    free memory x 0.9, the budget measured once at its own size
#   3. cycle-profile.txt  one BlockServe-shaped cycle (32 rows of 7-512 tokens) packed and dense under
#                    torch.profiler: host time beside kernel time, operators dispatched, time per group
#   4. bench.json    `dllm bench` at the profiled budget: static, blockserve (packed), blockserve-dense
#                    on a mixed workload (sequential too with POLICY=...), rewritten after each policy (a
#                    run cut short keeps what it measured);
#                    the threshold is calibrated so that half of a block's first-forward confidences
#                    reach it, since random weights never reach 0.9 and every block would take all
#                    32 steps
#   5. bench-fixed.json  the same workload in the paper's fixed-steps setting (blocks of 32, 32 steps per
#                    block, one token a step: a number of forwards that random weights do not change),
#                    static against blockserve (FIXED_POLICY=...), each with --batch-invariant and without
#                    in the same run (its cost: vs_batch_invariant_off; INVARIANT=on or off runs one way)
#   6. (summary.txt) `dllm bench` under Poisson arrivals at the profiled budget (the dense profile's: one memory
#                    limit), BlockServe dense, dLLM-Serve dense and dLLM-Serve with the uniform head-sparse
#                    cache at retention 0.5 and 0.3 (SPARSE_POLICY=..., SPARSE_RATE, SPARSE_REQUESTS): rows
#                    resident per cycle, tokens/s, latencies, refresh share and peak memory, a table only
#                    (a lease brings back eight files); every run in one process, as on a GPU (on a CPU
#                    rehearsal the peak is then the process's since it started)
#   7. llada2/         the profile and the fixed-steps bench for a random model of the LLaDA2.0-mini shape
#                    (block diffusion, 256 experts; its exact KV cache sized by the profiled budget),
#                    BlockServe against static batching (skip with BLOCK_MODEL=)
#   8. tp/               on a machine with several GPUs (or with TENSOR_PARALLEL=N): `dllm generate` at 1 and
#                    N ranks (the same tokens) and the mixed-workload BlockServe bench at N ranks beside
#                    step 4's one (tp/bench.json; TENSOR_PARALLEL=1 skips it); then the block model's
#                    fixed-steps BlockServe bench at --tensor-parallel N, --expert-parallel N and both
#                    (tp/llada2-tensor.json, -expert.json, -both.json: tokens per second, collectives and
#                    bytes sent per forward), each at the budget step 6 measured for one GPU; on a machine
#                    with one GPU, the same three splits and one process of random:llada2-tiny on its CPUs
#                    at 2 gloo ranks instead (summary.txt; CPU_SPLITS=1 runs them anywhere, 0 skips them)
# summary.txt holds every printed table. Eight files in all (bench.png too with PLOT=1), what one device
# lease brings back.
# Usage: bash scripts/gpu-bench.sh [OUT_DIR]          (default OUT_DIR: runs/gpu)
# CPU rehearsal (what CI runs): DEVICE=cpu MODEL=random:llada-tiny DTYPE=float32 MEMORY_LIMIT=600M \
#   MAX_TOKENS=2048 WORKLOAD=synthetic:n=12,prompt=8-100,gen=32-96,seed=0 BLOCK_MODEL=random:llada2-tiny \
#   BLOCK_MAX_TOKENS=1024 BLOCK_WORKLOAD=synthetic:n=6,prompt=8-60,gen=32-64,seed=0 CYCLE_ROWS=4 CYCLE_WIDTH=40 CYCLE_REPEATS=1 CYCLE_STEPS=2 \
#   bash scripts/gpu-bench.sh OUT
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p;}' "$0"; exit 0 ;; esac
case "${1:-}" in -*) echo "gpu-bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
out=${1:-runs/gpu}
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
model=${MODEL:-random:llada-8b}
dtype=${DTYPE:-bfloat16}
workload=${WORKLOAD:-synthetic:n=32,prompt=32-512,gen=32-256,seed=0}
policies=${POLICY:-static,blockserve,blockserve-dense}
max_tokens=${MAX_TOKENS:-65536}
calibrate=${CALIBRATE:-0.5}
mkdir -p "$out"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

dllm() { "$python" -m engine_pod.cli.main "$@"; }
budget_of() { "$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["token_budget"])' "$1"; }
step() { echo "== gpu-bench [$((SECONDS))s] $*"; }
# one line a split: tokens per second, collectives and bytes sent per forward (the reports given, in order)
print_splits() {
  "$python" - "$@" <<'PY' | tee -a "$out/summary.txt"
import json
import sys

for path in sys.argv[1:]:
    try:
        report = json.load(open(path))
    except FileNotFoundError:
        continue
    run = report["policies"]["blockserve"]
    print(
        f"--tensor-parallel {report['tensor_parallel']} --expert-parallel {report['expert_parallel']}: "
        f"{run['tokens_per_s']:.1f} tok/s, {run.get('collectives_per_forward')} collectives and "
        f"{run.get('bytes_sent_per_forward')} bytes sent per forward"
    )
PY
}

step "device"
"$python" - "$device" <<'PY' | tee "$out/device.txt"
import sys

import torch

device = sys.argv[1]
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {device}")
if device.startswith("cuda"):
    props = torch.cuda.get_device_properties(torch.device(device))
    free, total = torch.cuda.mem_get_info(torch.device(device))
    print(f"{props.name}: {total / 2**30:.1f} GiB total, {free / 2**30:.1f} GiB free")
PY

step "profile ($model, $dtype, grid up to $max_tokens tokens)"
limit_args=(--utilization 0.9)
[ -n "${MEMORY_LIMIT:-}" ] && limit_args=(--memory-limit "$MEMORY_LIMIT")
timeout "${PROFILE_TIMEOUT:-200}" "$python" -m engine_pod.cli.main profile --model "$model" --device "$device" \
  --dtype "$dtype" "${limit_args[@]}" --max-tokens "$max_tokens" --json "$out/profile.json"

step "cycle profile (packed and dense)"
for layout in packed dense; do
  timeout "${CYCLE_TIMEOUT:-90}" "$python" scripts/cycle_profile.py --model "$model" --device "$device" \
    --dtype "$dtype" --layout "$layout" --mixed --rows "${CYCLE_ROWS:-32}" --width "${CYCLE_WIDTH:-512}" \
    --repeats "${CYCLE_REPEATS:-7}" --steps "${CYCLE_STEPS:-32}" \
    2>&1 | grep -v profiler_st || true
done | tee "$out/cycle-profile.txt"

plot_args=()
[ -n "${PLOT:-}" ] && plot_args=(--plot "$out/bench.png")
step "bench ($workload: $policies)"
status=0
timeout "${BENCH_TIMEOUT:-330}" "$python" -m engine_pod.cli.main bench --model "$model" --device "$device" \
  --dtype "$dtype" --profile "$out/profile.json" --workload "$workload" --policy "$policies" \
  --calibrate-threshold "$calibrate" --no-isolate --no-margins --json "$out/bench.json" \
  "${plot_args[@]}" | tee "$out/summary.txt" || status=$?

fixed=(--block-length 32 --steps-per-block 32 --remasking low_confidence)
fixed_policies=${FIXED_POLICY:-static,blockserve}
invariant=${INVARIANT:-on,off}
step "bench, fixed steps ($workload: $fixed_policies, --batch-invariant $invariant)"
timeout "${BENCH_TIMEOUT:-330}" "$python" -m engine_pod.cli.main bench --model "$model" --device "$device" \
  --dtype "$dtype" --profile "$out/profile.json" --workload "$workload" --policy "$fixed_policies" \
  "${fixed[@]}" --batch-invariant "$invariant" --no-isolate --no-margins --json "$out/bench-fixed.json" \
  | tee -a "$out/summary.txt" || status=$?

sparse_policies=${SPARSE_POLICY-blockserve:dense,dllm-serve:dense,dllm-serve:uniform@0.5,dllm-serve:uniform@0.3}
if [ -n "$sparse_policies" ]; then
  step "bench, one memory limit, Poisson arrivals ($workload: $sparse_policies)"
  timeout "${BENCH_TIMEOUT:-330}" "$python" -m engine_pod.cli.main bench --model "$model" --device "$device" \
    --dtype "$dtype" --profile "$out/profile.json" --workload "$workload" --policy "$sparse_policies" \
    --arrival-rate "${SPARSE_RATE:-4}" --requests "${SPARSE_REQUESTS:-32}" --no-isolate \
    | tee -a "$out/summary.txt" || status=$?
fi

block_model=${BLOCK_MODEL-random:llada2-mini}
if [ -n "$block_model" ]; then
  step "block diffusion: profile and fixed-steps bench ($block_model)"
  mkdir -p "$out/llada2"
  timeout "${PROFILE_TIMEOUT:-200}" "$python" -m engine_pod.cli.main profile --model "$block_model" \
    --device "$device" --dtype "$dtype" "${limit_args[@]}" --max-tokens "${BLOCK_MAX_TOKENS:-$max_tokens}" \
    --json "$out/llada2/profile.json" || status=$?
  timeout "${BENCH_TIMEOUT:-330}" "$python" -m engine_pod.cli.main bench --model "$block_model" \
    --device "$device" --dtype "$dtype" --profile "$out/llada2/profile.json" \
    --workload "${BLOCK_WORKLOAD:-synthetic:n=16,prompt=32-512,gen=32-256,seed=0}" \
    --policy blockserve,static "${fixed[@]}" --no-isolate --no-margins \
    --json "$out/llada2/bench-fixed.json" | tee -a "$out/summary.txt" || status=$?
fi

tp=${TENSOR_PARALLEL:-}
if [ -z "$tp" ] && [ "${device%%:*}" = cuda ]; then
  tp=$("$python" -c 'import torch; print(min(torch.cuda.device_count(), 8))')
fi
if [ -n "$tp" ] && [ "$tp" -gt 1 ]; then
  step "tensor parallel: $tp ranks ($model)"
  mkdir -p "$out/tp"
  for ranks in 1 "$tp"; do
    timeout "${BENCH_TIMEOUT:-330}" "$python" -m engine_pod.cli.main generate --model "$model" --device "$device" \
      --dtype "$dtype" --prompt-ids 5,17,33,8,101,64,12 --gen-length 64 --tensor-parallel "$ranks" --json \
      > "$out/tp/generate-$ranks.json" || status=$?
  done
  timeout "${BENCH_TIMEOUT:-330}" "$python" -m engine_pod.cli.main bench --model "$model" --device "$device" \
    --dtype "$dtype" --token-budget "$(budget_of "$out/profile.json")" --workload "$workload" \
    --policy blockserve --calibrate-threshold "$calibrate" --no-margins --tensor-parallel "$tp" \
    --json "$out/tp/bench.json" | tee -a "$out/summary.txt" || status=$?
  if [ -n "$block_model" ] && [ -f "$out/llada2/profile.json" ]; then
    step "tensor against expert parallelism: $tp ranks ($block_model)"
    for split in tensor expert both; do
      case "$split" in
        tensor) sizes=(--tensor-parallel "$tp") ;;
        expert) sizes=(--expert-parallel "$tp") ;;
        both) sizes=(--tensor-parallel "$tp" --expert-parallel "$tp") ;;
      esac
      timeout "${BENCH_TIMEOUT:-330}" "$python" -m engine_pod.cli.main bench --model "$block_model" \
        --device "$device" --dtype "$dtype" --token-budget "$(budget_of "$out/llada2/profile.json")" \
        --workload "${BLOCK_WORKLOAD:-synthetic:n=16,prompt=32-512,gen=32-256,seed=0}" --policy blockserve \
        "${fixed[@]}" --no-margins "${sizes[@]}" --json "$out/tp/llada2-$split.json" \
        | tee -a "$out/summary.txt" || status=$?
    done
    print_splits "$out"/tp/llada2-{tensor,expert,both}.json
  fi
elif [ "${CPU_SPLITS:-auto}" = 1 ] || { [ "${CPU_SPLITS:-auto}" = auto ] && [ "${device%%:*}" = cuda ]; }; then
  # one GPU: the experts cannot be spread over devices, so the comparison docs/benchmarks.md shows runs on this
  # machine's CPUs (two gloo ranks; its table only, in summary.txt; CPU_SPLITS=0 skips it)
  step "tensor against expert parallelism on the CPUs: 2 ranks (random:llada2-tiny)"
  splits=$(mktemp -d)
  for sizes in "1 1" "2 1" "1 2" "2 2"; do
    read -r tensor expert <<<"$sizes"
    timeout "${BENCH_TIMEOUT:-330}" "$python" -m engine_pod.cli.main bench --model random:llada2-tiny --device cpu \
      --workload synthetic:n=8,prompt=16-64,gen=32-64,seed=0 --policy blockserve --calibrate-threshold 0.5 \
      --threads 2 --no-margins --tensor-parallel "$tensor" --expert-parallel "$expert" \
      --json "$splits/cpu-$tensor-$expert.json" >/dev/null || status=$?
  done
  print_splits "$splits"/cpu-{1-1,2-1,1-2,2-2}.json
  rm -rf "$splits"
fi

step "done (bench exit status $status)"
"$python" - "$out/profile.json" "$out/bench.json" <<'PY'
import json
import sys

profile = json.load(open(sys.argv[1]))
fit, checks = profile["fit"], profile["budget_checks"]
print(
    f"profile: {profile['device_name']}, usable {profile['usable_memory_bytes'] / 2**30:.1f} GiB of "
    f"{profile['free_memory_bytes'] / 2**30:.1f} GiB free, weights {profile['weights_bytes'] / 2**30:.1f} GiB, "
    f"{fit['bytes_per_token']:.0f} B/token (R^2 {fit['r_squared']:.4f}), budget {profile['token_budget']} tokens "
    f"({profile['extrapolation']['factor']}x the largest grid point); check at {checks[-1]['tokens']} tokens: "
    f"{checks[-1]['measured_bytes'] / 2**30:.2f} GiB {profile['peak_measure']}"
    + (f", {checks[-1]['allocated_bytes'] / 2**30:.2f} GiB allocated" if checks[-1]["allocated_bytes"] else "")
)
try:
    bench = json.load(open(sys.argv[2]))
except FileNotFoundError:
    sys.exit("no bench result")
print(f"bench: policies measured {', '.join(bench['policies'])}")
PY
exit "$status"
