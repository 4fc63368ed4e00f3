#!/usr/bin/env bash
# The memory planner against the GPU (docs/memory_planning.md "Validation"): for each case below, the predicted peak
# of `moetrain plan --memory --json` beside the peak `bench_train` measures (peak_device_bytes: the caching
# allocator's most bytes handed out at once over the warm-up and the timed steps, the figure the planner predicts),
# with the relative error, and the same for the state (state_bytes) and the rest (peak_activation_bytes = peak -
# state). Prints one Markdown table and how many cases are within 10%.
# Run on a GPU machine from the repository root, with a CUDA build of moetrain and bench_train:
#   tools/plan_vs_measured.sh [BUILD_DIR] [FILTER]
#     BUILD_DIR  default build-gpu (cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a; targets moetrain
#                bench_train)
#     FILTER     a grep -E pattern on the case names (default: every case; about 12 minutes on one H200, so split
#                it over device calls, e.g. 'hybrid_1b3 4x' then 'kimi|dense|32768')
# Env: STEPS (timed steps, default 2), WARMUP (default 1), LOG_DIR (keeps each case's two JSON lines there).
# On the project's device machine (the libraries as in docs/testing.md "The whole GPU suite"; carry .device-deps):
#   source .device-deps/device-setup.sh && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
#     -DCMAKE_CUDA_ARCHITECTURES=90a && cmake --build build-gpu -j 16 --target moetrain bench_train &&
#   LOG_DIR=$OUT tools/plan_vs_measured.sh build-gpu 'hybrid_1b3 4x' | tee $OUT/plan_vs_measured.md
set -euo pipefail
set -f  # the recompute.modules values are TOML arrays, not globs
build=${1:-build-gpu}
filter=${2:-.}
steps=${STEPS:-2}
warmup=${WARMUP:-1}
plan_bin=$build/moetrain
bench_bin=$build/bench/bench_train
for b in "$plan_bin" "$bench_bin"; do
    [[ -x $b ]] || { echo "plan_vs_measured: $b is missing (build moetrain and bench_train in $build)" >&2; exit 2; }
done
log_dir=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$log_dir"

# The integer value of a top-level or nested "key": in a one-line JSON object (the first occurrence).
json_int() { grep -o "\"$2\":[0-9]*" <<< "$1" | head -1 | cut -d: -f2; }
gb() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1e9 }'; }
err() { awk -v p="$1" -v m="$2" 'BEGIN { printf "%+.1f%%", 100 * (p - m) / m }'; }

rows=()
within=0
total=0
# run_case NAME CONFIG [--set k=v ...]
run_case() {
    local name=$1 config=$2
    shift 2
    grep -qE -- "$filter" <<< "$name" || return 0
    local slug=${name//[^A-Za-z0-9]/_}
    local plan bench
    # A case that fails (an out-of-memory bench_train, say) gets a row saying so; the others still run.
    if ! plan=$("$plan_bin" plan --memory --json --device cuda --config "$config" "$@" 2> "$log_dir/$slug.err"); then
        rows+=("| $name | plan failed: $(head -1 "$log_dir/$slug.err") |")
        return 0
    fi
    if ! bench=$("$bench_bin" --config "$config" --steps "$steps" --warmup "$warmup" "$@" 2> "$log_dir/$slug.err" |
        grep '"bench":"train_step"'); then
        rows+=("| $name | $(gb "$(json_int "$plan" peak_device_bytes)") | bench_train failed: $(grep -m1 error "$log_dir/$slug.err") |")
        return 0
    fi
    printf '%s\n%s\n' "$plan" "$bench" > "$log_dir/$slug.jsonl"
    local pp mp ps ms pa ma
    pp=$(json_int "$plan" peak_device_bytes)
    mp=$(json_int "$bench" peak_device_bytes)
    ps=$(json_int "$plan" state_bytes)
    ms=$(json_int "$bench" state_bytes)
    pa=$(json_int "$plan" peak_activation_bytes)
    ma=$(json_int "$bench" peak_activation_bytes)
    rows+=("| $name | $(gb "$pp") | $(gb "$mp") | $(err "$pp" "$mp") | $(gb "$ps") | $(gb "$ms") | $(gb "$pa") | $(gb "$ma") | $(err "$pa" "$ma") |")
    total=$((total + 1))
    if awk -v p="$pp" -v m="$mp" 'BEGIN { d = (p - m) / m; exit !(d <= 0.1 && d >= -0.1) }'; then within=$((within + 1)); fi
    echo "plan_vs_measured: $name done" >&2
}

H=configs/hybrid_1b3.toml
K=configs/kimi_linear_mini.toml
D=configs/dense_1b3.toml
sel() { echo "--set recompute.policy=selective --set recompute.modules=$1"; }
L32=(--set model.max_seq_len=32768 --set train.seq_len=32768 --set train.batch_size=1)
REC='["norm","mlp_act","moe_act","attnres","moe_permute","kda"]'
# shellcheck disable=SC2046  # sel's output is meant to split into words
{
    run_case "hybrid_1b3 4x4096 none" $H
    run_case "hybrid_1b3 4x4096 attn_core" $H $(sel '["attn_core"]')
    run_case "hybrid_1b3 4x4096 norm+mlp_act" $H $(sel '["norm","mlp_act"]')
    run_case "hybrid_1b3 4x4096 kda" $H $(sel '["kda"]')
    run_case "hybrid_1b3 4x4096 norm+mlp_act+kda" $H $(sel '["norm","mlp_act","kda"]')
    run_case "hybrid_1b3 4x4096 all four" $H $(sel '["attn_core","norm","mlp_act","kda"]')
    run_case "hybrid_1b3 4x4096 full every 1" $H --set recompute.policy=full --set recompute.every=1
    run_case "hybrid_1b3 4x4096 full every sqrt" $H --set recompute.policy=full --set recompute.every=sqrt
    run_case "hybrid_1b3 1x32768 none" $H "${L32[@]}"
    run_case "dense_1b3 4x4096 none" $D
    run_case "dense_1b3 4x4096 full every 1" $D --set recompute.policy=full --set recompute.every=1
    run_case "kimi_linear_mini 4x4096 none" $K
    run_case "kimi_linear_mini 4x4096 recommended" $K $(sel "$REC")
    run_case "kimi_linear_mini 4x4096 full every 1" $K --set recompute.policy=full --set recompute.every=1
}

echo "| case | predicted peak GB | measured peak GB | error | predicted state GB | measured state GB | predicted peak - state GB | measured peak - state GB | error |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "$within of $total cases within 10% of the measured peak (bench_train --steps $steps --warmup $warmup; raw JSON in $log_dir)"
