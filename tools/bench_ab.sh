#!/usr/bin/env bash
# Before/after benchmarks in one device call, for "no case slower than before" checks across a change: builds the
# before tree (a `git archive` of the old commit, unpacked at BEFORE_SRC) beside this tree, then runs each named
# benchmark on both, in the order before, after, before, after (ROUNDS times), so that a drift of the GPU over the
# call shows up as a difference between rounds rather than between binaries. Prints one JSON line per case to
# stdout, each with "side" (before|after) and "round" added: stdout comes back from the device in full, where many
# files under $OUT may not.
#   tools/bench_ab.sh BEFORE_SRC CASE...      CASE: attention | kda | moe | train:CONFIG (e.g. train:hybrid_1b3)
# Example (device): git archive ae2fe0e | tar -x -C .gpu-carry/before; tools/bench_ab.sh .gpu-carry/before train:dense_1b3 train:hybrid_1b3
# ROUNDS (default 2), AFTER_BUILD (default build-gpu, built here if missing), BEFORE_BUILD (default build-before).
set -uo pipefail
before_src=$1; shift
rounds=${ROUNDS:-2}; after_build=${AFTER_BUILD:-build-gpu}; before_build=${BEFORE_BUILD:-build-before}
cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a)
jobs=$(nproc)
[ -x "$after_build/bench/bench_train" ] || { cmake -S . -B "$after_build" "${cfg[@]}" >/dev/null && cmake --build "$after_build" -j "$jobs" >/dev/null; } &
[ -x "$before_build/bench/bench_train" ] || { cmake -S "$before_src" -B "$before_build" "${cfg[@]}" >/dev/null && cmake --build "$before_build" -j "$jobs" --target moetrain bench_attention bench_kda bench_moe bench_train >/dev/null; } &
wait
for b in "$after_build" "$before_build"; do
    [ -x "$b/bench/bench_train" ] || { echo "bench_ab: the build in $b failed" >&2; exit 1; }
done
run_case() {  # side build src case round
    local side=$1 build=$2 src=$3 case=$4 round=$5 out
    case $case in
        attention) out=$("$build/bench/bench_attention" 2>&1) ;;
        kda) out=$("$build/bench/bench_kda" --keep none --iters 3 2>&1) ;;
        moe) out=$("$build/bench/bench_moe" 2>&1) ;;
        train:*) out=$("$build/bench/bench_train" --config "$src/configs/${case#train:}.toml" --steps 6 --warmup 2 2>&1) ;;
        *) echo "bench_ab: unknown case $case" >&2; return 1 ;;
    esac
    # Tag every JSON line; pass anything else (an error) through to stderr.
    while IFS= read -r line; do
        if [[ $line == \{* ]]; then
            echo "{\"side\": \"$side\", \"round\": $round, ${line:1}"
        else
            echo "$side: $line" >&2
        fi
    done <<< "$out"
}
for case in "$@"; do
    for ((r = 1; r <= rounds; ++r)); do
        run_case before "$before_build" "$before_src" "$case" "$r"
        run_case after "$after_build" . "$case" "$r"
    done
done
