#!/usr/bin/env bash
# The long-context benchmarks of docs/PERFORMANCE.md "Long context" on one GPU, each case one bench_train JSON line
# (tokens/s, ms per step, MFU, peak device and host memory, segments, the loss):
#   overhead  hybrid_1b3 at 32,768 tokens in J = 1, 2, 4 segments (the cost of re-running the forwards)
#   growth    hybrid_1b3 with 4 key/value heads at 131,072, 262,144 and 1,048,576 tokens in segments of 65,536
#             under recompute full, the million with and without long.offload_kv
#   kimi      kimi_linear_mini at 1,048,576 tokens the same way
# One timed step after one warm-up step each (three at 32,768; a million-token step is minutes). CASES picks a subset.
#   bench/long_context.sh BUILD_DIR [CASES...]      CASES: overhead growth kimi (default: all three)
set -uo pipefail
build=$1
shift
cases=("$@")
((${#cases[@]})) || cases=(overhead growth kimi)
bench=("$build/bench/bench_train" --warmup 1 --set run.deterministic=false)
long() {  # config, seq, timed steps, extra settings
    local config=$1 seq=$2 steps=$3
    shift 3
    "${bench[@]}" --steps "$steps" --config "$config" --set model.max_seq_len="$seq" --set train.seq_len="$seq" \
        --set train.batch_size=1 --set train.grad_accum=1 "$@" | grep '^{"' || echo "{\"bench\": \"train_step\", \"config\": \"$config\", \"seq\": $seq, \"error\": \"exit $?\"}"
}
for c in "${cases[@]}"; do
    case $c in
    overhead)
        for j in 1 2 4; do long configs/hybrid_1b3.toml 32768 3 --set long.segments=$j; done ;;
    growth)
        for seq in 131072 262144 1048576; do
            long configs/hybrid_1b3.toml $seq 1 --set model.n_kv_heads=4 --set long.segment_tokens=65536 \
                --set recompute.policy=full
        done
        long configs/hybrid_1b3.toml 1048576 1 --set model.n_kv_heads=4 --set long.segment_tokens=65536 \
            --set recompute.policy=full --set long.offload_kv=true ;;
    kimi)
        long configs/kimi_linear_mini.toml 1048576 1 --set long.segment_tokens=65536 --set recompute.policy=full ;;
    *) echo "long_context.sh: unknown case $c (overhead, growth, kimi)" >&2; exit 2 ;;
    esac
done
