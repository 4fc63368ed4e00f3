#!/usr/bin/env bash
# The long-context benchmarks of docs/PERFORMANCE.md "Long context" on one GPU, each case one bench_train JSON line
# (tokens/s, ms per step, MFU, peak device and host memory, segments, the loss):
#   overhead  hybrid_1b3 at 32,768 tokens in J = 1, 2, 4 segments (the cost of re-running the forwards)
#   growth    hybrid_1b3 with 4 key/value heads at 131,072 and 262,144 tokens in segments of 65,536 under recompute
#             full, the longer also with long.offload_kv
#   million   the same at 1,048,576 tokens (one step of several minutes, no warm-up step)
#   kimi      kimi_linear_mini at 1,048,576 tokens the same way
# One timed step after one warm-up step (three at 32,768; none before a million-token step). CASES picks a subset:
# a device call is at most 10 minutes, so the million-token cases want a call each.
#   bench/long_context.sh BUILD_DIR [CASES...]      CASES: overhead growth million kimi (default: all four)
set -uo pipefail
build=$1
shift
cases=("$@")
((${#cases[@]})) || cases=(overhead growth million kimi)
bench=("$build/bench/bench_train" --set run.deterministic=false)
long() {  # config, seq, warm-up steps, timed steps, extra settings
    local config=$1 seq=$2 warmup=$3 steps=$4
    shift 4
    "${bench[@]}" --warmup "$warmup" --steps "$steps" --config "$config" --set model.max_seq_len="$seq" --set train.seq_len="$seq" \
        --set train.batch_size=1 --set train.grad_accum=1 "$@" | grep '^{"' || echo "{\"bench\": \"train_step\", \"config\": \"$config\", \"seq\": $seq, \"error\": \"exit $?\"}"
}
for c in "${cases[@]}"; do
    case $c in
    overhead)
        for j in 1 2 4; do long configs/hybrid_1b3.toml 32768 1 3 --set long.segments=$j; done ;;
    growth)
        for seq in 131072 262144; do
            long configs/hybrid_1b3.toml $seq 1 1 --set model.n_kv_heads=4 --set long.segment_tokens=65536 \
                --set recompute.policy=full
        done
        long configs/hybrid_1b3.toml 262144 1 1 --set model.n_kv_heads=4 --set long.segment_tokens=65536 \
            --set recompute.policy=full --set long.offload_kv=true ;;
    million)
        long configs/hybrid_1b3.toml 1048576 0 1 --set model.n_kv_heads=4 --set long.segment_tokens=65536 \
            --set recompute.policy=full ;;
    kimi)
        long configs/kimi_linear_mini.toml 1048576 0 1 --set long.segment_tokens=65536 --set recompute.policy=full ;;
    *) echo "long_context.sh: unknown case $c (overhead, growth, million, kimi)" >&2; exit 2 ;;
    esac
done
