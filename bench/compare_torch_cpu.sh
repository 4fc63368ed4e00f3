#!/usr/bin/env bash
# moetrain vs PyTorch eager on the CPU: the same model, batch and optimizer step, the same thread count, in one
# run on one machine. Runs build/bench/bench_train, then tools/reference/bench_torch.py, then bench_train again
# (so that drift in machine load shows up), prints their JSON lines and a final ratio line:
#   {"bench":"train_step_ratio","moetrain_over_pytorch":R,...}   R = moetrain tokens/s / PyTorch tokens/s
# (R > 1: moetrain is faster; computed from the better of the two moetrain runs and from each separately).
# Usage: bench/compare_torch_cpu.sh [BUILD_DIR=build] [CONFIG=configs/tiny.toml] [STEPS=20]
# Env: PYTHON (default /usr/bin/python3), THREADS (default: what bench_train reports, else all cores),
#      WARMUP (default 3), EXTRA_SET (extra "--set k=v" words passed to both),
#      TUNE (default 1: bench_torch.py --tune, PyTorch's fastest of three OpenMP/OpenBLAS thread layouts).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build}
CONFIG=${2:-$ROOT/configs/tiny.toml}
STEPS=${3:-20}
PYTHON=${PYTHON:-/usr/bin/python3}
WARMUP=${WARMUP:-3}
tune_args=()
[[ ${TUNE:-1} == 1 ]] && tune_args=(--tune)
read -r -a EXTRA <<< "${EXTRA_SET:-}"
# The PyTorch model has no document masking: both sides run without it (random tokens hold the EOT too).
EXTRA=(--set data.document_mask=false "${EXTRA[@]}")

BENCH=$BUILD/bench/bench_train
[[ -x $BENCH ]] || { echo "compare_torch_cpu: $BENCH not found; build the bench_train target first" >&2; exit 1; }
"$PYTHON" -c 'import torch' 2>/dev/null || { echo "compare_torch_cpu: $PYTHON cannot import torch" >&2; exit 1; }

threads_args=()
[[ -n ${THREADS:-} ]] && threads_args=(--set "run.threads=$THREADS")

mt1=$("$BENCH" --config "$CONFIG" --steps "$STEPS" "${threads_args[@]}" "${EXTRA[@]}" | grep '"train_step"' | tail -n 1)
echo "$mt1"
# PyTorch gets the thread count moetrain actually used.
T=${THREADS:-$(printf '%s' "$mt1" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin).get("threads", 0))')}
pt=$("$PYTHON" "$ROOT/tools/reference/bench_torch.py" --config "$CONFIG" --steps "$STEPS" --warmup "$WARMUP" \
        --threads "$T" "${tune_args[@]}" "${EXTRA[@]}")
echo "$pt"
mt2=$("$BENCH" --config "$CONFIG" --steps "$STEPS" "${threads_args[@]}" "${EXTRA[@]}" | grep '"train_step"' | tail -n 1)
echo "$mt2"

"$PYTHON" - "$mt1" "$pt" "$mt2" <<'PY'
import json, sys
mt1, pt, mt2 = (json.loads(s) for s in sys.argv[1:4])
for a in (mt1, mt2):
    if (a["batch"], a["seq"]) != (pt["batch"], pt["seq"]):
        sys.exit(f"compare_torch_cpu: shapes differ: moetrain {a['batch']}x{a['seq']}, pytorch {pt['batch']}x{pt['seq']}")
best = max(mt1["tokens_per_s"], mt2["tokens_per_s"])
print(json.dumps({
    "bench": "train_step_ratio",
    "moetrain_over_pytorch": round(best / pt["tokens_per_s"], 3),
    "runs": [round(mt1["tokens_per_s"] / pt["tokens_per_s"], 3), round(mt2["tokens_per_s"] / pt["tokens_per_s"], 3)],
    "metric": "tokens_per_s",
    "moetrain_tokens_per_s": best, "pytorch_tokens_per_s": pt["tokens_per_s"],
    "batch": pt["batch"], "seq": pt["seq"], "steps": pt["steps"],
    "threads": {"moetrain": mt1.get("threads"), "pytorch": pt["threads"],
                "pytorch_omp": pt.get("omp_threads"), "pytorch_blas": pt.get("blas_threads")},
    "torch": pt["torch"]}))
PY
