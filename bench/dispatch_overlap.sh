#!/usr/bin/env bash
# The cost of overlapped expert dispatch on one GPU (issue 28, docs/distributed.md "Overlapped dispatch"): bench_train
# on CONFIG with `moe.overlap_dispatch = false` (blocking) and `true` (the default), alternated REPEAT times because a
# machine drifts by a few percent between runs. At ep = 1 there is no all-to-all to hide, so the difference is what the
# second stream and its events cost the one-GPU path (the target: overlapped within 1% of blocking). Prints every
# run's JSON line, then a summary line: the median ms per step of each side, the ratio and both peaks.
#   bench/dispatch_overlap.sh BUILD_DIR [CONFIG] [REPEAT] [bench_train args...]
#   bench/dispatch_overlap.sh build configs/kimi_linear_mini.toml 3 --steps 6 --warmup 2
set -euo pipefail
build=$1 config=${2:-configs/kimi_linear_mini.toml} repeat=${3:-3}
shift $(($# < 3 ? $# : 3))
((repeat >= 1)) || { echo "dispatch_overlap.sh: REPEAT must be at least 1" >&2; exit 2; }
bench=("$build/bench/bench_train" --config "$config" --set run.deterministic=false "$@")
lines=()
for ((i = 0; i < repeat; ++i)); do
    for overlap in false true; do
        line=$("${bench[@]}" --set moe.overlap_dispatch=$overlap | grep '^{"' | sed -n 1p)  # no SIGPIPE under pipefail
        line=$(python3 -c 'import json, sys; d = json.loads(sys.argv[1]); d["overlap_dispatch"] = sys.argv[2] == "true"
print(json.dumps(d))' "$line" "$overlap")
        echo "$line"
        lines+=("$line")
    done
done
printf '%s\n' "${lines[@]}" | python3 -c '
import json, statistics, sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]
side = lambda on: [r for r in runs if r["overlap_dispatch"] == on]
ms = {on: statistics.median(r["ms_per_step"] for r in side(on)) for on in (False, True)}
peak = {on: max(r.get("peak_device_bytes", r.get("peak_host_bytes", 0)) for r in side(on)) for on in (False, True)}
print(json.dumps({"bench": "dispatch_overlap", "config": runs[0]["config"], "device": runs[0]["device"],
                  "runs": len(runs) // 2, "blocking_ms_per_step": round(ms[False], 2),
                  "overlapped_ms_per_step": round(ms[True], 2), "overlapped_over_blocking": round(ms[True] / ms[False], 4),
                  "within_1_percent": ms[True] <= 1.01 * ms[False],
                  "peak_bytes_blocking": peak[False], "peak_bytes_overlapped": peak[True]}))'
