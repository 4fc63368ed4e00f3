#!/usr/bin/env bash
# Data-parallel scaling on GPUs: bench_train on one GPU and under `mpirun -np N` (dp = N, the same per-rank batch,
# so the global batch is N times larger), alternated REPEAT times because machines drift by a few percent between
# runs. Prints every run's JSON line, then one summary line: the median tokens/s of each side and their ratio.
#   bench/dp_scaling.sh BUILD_DIR CONFIG [N] [REPEAT] [bench_train args...]
#   bench/dp_scaling.sh build configs/moe_464m.toml 2 3 --steps 20 --set train.grad_accum=4
set -euo pipefail
build=$1 config=$2 n=${3:-2} repeat=${4:-3}
shift $(($# < 4 ? $# : 4))
((repeat >= 1)) || { echo "dp_scaling.sh: REPEAT must be at least 1" >&2; exit 2; }
bench=("$build/bench/bench_train" --config "$config" "$@")
mpi=(mpirun --allow-run-as-root -np "$n" --bind-to none)
one=() many=()
for ((i = 0; i < repeat; ++i)); do
    line=$("${bench[@]}" | grep '^{"' | sed -n 1p)  # reads everything: no SIGPIPE under pipefail
    echo "$line"
    one+=("$line")
    line=$("${mpi[@]}" "${bench[@]}" | grep '^{"' | sed -n 1p)  # reads everything: no SIGPIPE under pipefail
    echo "$line"
    many+=("$line")
done
printf '%s\n' "${one[@]}" "${many[@]}" | python3 -c '
import json, statistics, sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]
one = statistics.median(r["tokens_per_s"] for r in runs if r["world"] == 1)
many = statistics.median(r["tokens_per_s"] for r in runs if r["world"] > 1)
n = max(r["world"] for r in runs)
print(json.dumps({"bench": "dp_scaling", "config": runs[0]["config"], "world": n, "batch": runs[0]["batch"],
                  "runs": len(runs) // 2, "tokens_per_s_1": round(one), "tokens_per_s_n": round(many),
                  "speedup": round(many / one, 3)}))'
