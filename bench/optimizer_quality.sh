#!/usr/bin/env bash
# Muon optimizer quality on the CPU (issue 29; docs/optimizer_experiments.md has the results and how to read them).
#   A: Muon against AdamW at equal tokens: configs/tiny_moe.toml on data/fortunes, same seed and data order, both at
#      their documented defaults (train.lr of the config for both), val loss every A_EVAL_EVERY steps. The summary
#      gives the tokens AdamW needs to reach Muon's final val loss (interpolated on AdamW's curve; null: not reached)
#      and the tokens Muon needs to reach AdamW's. With A_ADAMW_MAX_STEPS > A_STEPS and AdamW short of Muon,
#      AdamW is rerun for that many steps (its own cosine schedule) to find the crossing.
#   B: gradient compression, ../shared/spec/muon.md §6's protocol, under dp = 2 (mpirun): the uncompressed
#      baseline at three seeds (the noise floor), then compress.level 1 (bf16_sr) and 2 (sign_ef) at the first seed.
#      The summary also checks the first compressed step against the baseline: the AdamW group's grad norm must be
#      bitwise equal (its slices travel raw) and, at level 1, the Muon group's within about 1e-3 relative.
# Prints one JSON line per run (its final figures), then one summary line per experiment.
#   bench/optimizer_quality.sh MOETRAIN OUT_DIR [all|A|B]
#   bench/optimizer_quality.sh build/moetrain /tmp/optq     # both: about 20 min (A) on 2 idle cores + 20 min (B)
#   B_STEPS=2000 B_WARMUP=1000 bench/optimizer_quality.sh build/moetrain /tmp/optq B   # the spec's full length
#   A_ADAMW_MAX_STEPS=4000 bench/optimizer_quality.sh build/moetrain /tmp/optq A      # AdamW run on to 4000 steps
# A finished run (a `done` file in its directory) is reused: use a fresh OUT_DIR after changing a knob.
# The GPU-sized A (kimi_linear_mini on the same text, one device; NICE=0 there):
#   A_CONFIG=kimi_linear_mini A_EXTRA="--set run.device=cuda --set train.batch_size=1" A_EVAL_BATCHES=8 NICE=0 \
#       bench/optimizer_quality.sh build/moetrain /tmp/optq_gpu A
# Knobs (environment): A_RUNS ("muon adamw": which of A's two runs to make now; the summary comes once both are
#   done, so a device with short calls runs one per call into the same OUT_DIR), A_STEPS (2000), A_ADAMW_MAX_STEPS (0: off), A_CONFIG (tiny_moe: a file of CONFIG_DIR without
#   .toml), A_EXTRA (more moetrain arguments for both A runs, split at spaces), A_EVAL_EVERY (100), A_EVAL_BATCHES (32),
#   B_CONFIG (tiny), B_STEPS (400), B_WARMUP (200: the spec's 1000 of 2000, scaled), B_BATCH (8 per rank: the
#   config's 16 sequences per step over the two ranks), B_CHUNK (2048), B_SEEDS ("1234 1235 1236"),
#   CONFIG_DIR (the repo's configs/), NICE (10). Needs python3 and, for B, Open MPI's mpirun.
set -euo pipefail
((${#} >= 2)) || { sed -n 2,25p "$0" >&2; exit 2; }
bin=$(realpath "$1") out=$(realpath -m "$2") which=${3:-all}
repo=$(cd "$(dirname "$0")/.." && pwd)
cfg=${CONFIG_DIR:-$repo/configs}
A_RUNS=${A_RUNS:-muon adamw}
A_STEPS=${A_STEPS:-2000} A_ADAMW_MAX_STEPS=${A_ADAMW_MAX_STEPS:-0} A_CONFIG=${A_CONFIG:-tiny_moe} A_EXTRA=${A_EXTRA:-}
A_EVAL_EVERY=${A_EVAL_EVERY:-100} A_EVAL_BATCHES=${A_EVAL_BATCHES:-32}
B_CONFIG=${B_CONFIG:-tiny} B_STEPS=${B_STEPS:-400} B_WARMUP=${B_WARMUP:-200} B_BATCH=${B_BATCH:-8}
B_CHUNK=${B_CHUNK:-2048} B_SEEDS=${B_SEEDS:-1234 1235 1236} NICE=${NICE:-10}
mkdir -p "$out/runs"
[[ -f $repo/data/fortunes/train.bin ]] || (cd "$repo" && "$bin" data --out data/fortunes)
common=(--set "data.paths=[\"$repo/data/fortunes/train.bin\"]" --set "data.val_paths=[\"$repo/data/fortunes/val.bin\"]"
        --set checkpoint.every_steps=0 --set metrics.layer_stats=false)

# summary RUN_DIR NAME WALL: one JSON line of the run's final figures
summary() {
    python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
run_dir, name, wall = sys.argv[1], sys.argv[2], float(sys.argv[3])
train, evals = [], []
for line in open(f"{run_dir}/metrics.jsonl"):
    d = json.loads(line)
    if d.get("kind") == "train": train.append(d)
    elif d.get("kind") == "eval": evals.append(d)
last = train[-1]
steps = last["step"]
tail = [d for d in train if d["step"] > steps - steps // 10]          # the last 10% of the steps
r = {"run": name, "steps": steps, "tokens": last["tokens_seen"], "final_val_loss": round(evals[-1]["val_loss"], 5),
     "last10pct_train_loss": round(sum(d["loss"] for d in tail) / len(tail), 5),
     "step_seconds_median": round(sorted(d["step_seconds"] for d in tail)[len(tail) // 2], 4), "wall_s": round(wall, 1)}
comp = [d for d in train if "compress/wire_bytes" in d]
if comp:
    c = comp[-1]
    r.update({"compressed_steps": len(comp), "wire_bytes_per_step": c["compress/wire_bytes"],
              "raw_bytes_per_step": c["compress/raw_bytes"],
              "leg_ratio": round(c["compress/raw_bytes"] / c["compress/wire_bytes"], 2),
              "ef_ratio_max": round(max(d.get("compress/ef_ratio", 0) for d in comp), 4),
              "ef_ratio_last": round(c.get("compress/ef_ratio", 0), 4),
              "compress_error_last": round(c.get("compress/error", 0), 4)})
if "comm/dp/bytes" in last and last["comm/dp/bytes"]:    # rank 0's payload: the reduce leg and the parameter gather
    r["comm_dp_bytes_rank0_per_step"] = last["comm/dp/bytes"]
    r["comm_dp_seconds_median"] = round(sorted(d.get("comm/dp/seconds", 0) for d in tail)[len(tail) // 2], 4)
print(json.dumps(r))
EOF
}

# run NAME [mpirun args --] moetrain-args...: trains into $out/runs/NAME (reused when complete) and prints its line
run() {
    local name=$1; shift
    local dir=$out/runs/$name launch=()
    if [[ ${1:-} == mpirun ]]; then while [[ $1 != -- ]]; do launch+=("$1"); shift; done; shift; fi
    if [[ ! -f $dir/done ]]; then
        rm -rf "$dir"; mkdir -p "$dir"
        local t0=$SECONDS
        nice -n "$NICE" "${launch[@]}" "$bin" train "${common[@]}" --set "run.dir=\"$dir\"" "$@" >"$dir/log.txt" 2>&1 \
            || { echo "optimizer_quality.sh: run $name failed, see $dir/log.txt" >&2; tail -5 "$dir/log.txt" >&2; exit 1; }
        echo $((SECONDS - t0)) >"$dir/done"
    fi
    summary "$dir" "$name" "$(cat "$dir/done")" | tee "$dir/summary.json"
}

if [[ $which == all || $which == A ]]; then
    read -r -a a_extra <<<"$A_EXTRA"
    a=(--config "$cfg/$A_CONFIG.toml" --set train.eval_every="$A_EVAL_EVERY" --set train.eval_batches="$A_EVAL_BATCHES"
       --set metrics.every=10 "${a_extra[@]}")
    for opt in $A_RUNS; do run "A_$opt" "${a[@]}" --set "optim.name=\"$opt\"" --set train.steps="$A_STEPS"; done
fi
# The summary once both runs are done (A_RUNS may run one of them per call, OUT_DIR kept between calls).
if [[ ($which == all || $which == A) && -f $out/runs/A_muon/done && -f $out/runs/A_adamw/done ]]; then
    long=$(python3 - "$out/runs" <<'EOF'
import json, sys
def val(name):
    return [json.loads(l) for l in open(f"{sys.argv[1]}/{name}/metrics.jsonl") if '"kind":"eval"' in l]
print("yes" if val("A_adamw")[-1]["val_loss"] > val("A_muon")[-1]["val_loss"] else "no")
EOF
)
    [[ $long == yes && $A_ADAMW_MAX_STEPS -gt $A_STEPS ]] && \
        run A_adamw_long "${a[@]}" --set 'optim.name="adamw"' --set train.steps="$A_ADAMW_MAX_STEPS"
    python3 - "$out/runs" <<'EOF'
import json, os, sys
root = sys.argv[1]
def load(name):
    ev, tok = [], {}
    for l in open(f"{root}/{name}/metrics.jsonl"):
        d = json.loads(l)
        if d.get("kind") == "eval": ev.append((d["step"], d["val_loss"]))
        elif d.get("kind") == "train": tok[d["step"]] = d["tokens_seen"] / d["step"]
    per_step = next(iter(tok.values()))
    return [(s, s * per_step, v) for s, v in ev], per_step
muon, per_step = load("A_muon")
target = muon[-1][2]
res = {"summary": "A", "muon_final_val_loss": round(target, 5), "muon_tokens": muon[-1][1]}
for name in ("A_adamw", "A_adamw_long"):
    if not os.path.exists(f"{root}/{name}/metrics.jsonl"): continue
    curve, _ = load(name)
    res[f"{name[2:]}_final_val_loss"] = round(curve[-1][2], 5)
    hit = curve[0][1] if curve[0][2] <= target else None   # linear interpolation at the first crossing
    for (s0, t0, v0), (s1, t1, v1) in zip(curve, curve[1:]):
        if hit is None and v1 <= target < v0:
            hit = t0 + (t1 - t0) * (v0 - target) / (v0 - v1)
    res[f"{name[2:]}_tokens_to_muon_final"] = round(hit) if hit else None
    res[f"{name[2:]}_tokens_run"] = curve[-1][1]
    if hit: res[f"{name[2:]}_token_ratio"] = round(hit / muon[-1][1], 3)
adamw, _ = load("A_adamw")          # the other way round: where Muon's curve reaches AdamW's final val loss
goal, back = adamw[-1][2], None
for (s0, t0, v0), (s1, t1, v1) in zip(muon, muon[1:]):
    if back is None and v1 <= goal < v0:
        back = t0 + (t1 - t0) * (v0 - goal) / (v0 - v1)
res["muon_tokens_to_adamw_final"] = round(back) if back else None
if back: res["adamw_over_muon_tokens"] = round(adamw[-1][1] / back, 3)
print(json.dumps(res))
EOF
fi

if [[ $which == all || $which == B ]]; then
    mpi=(mpirun --allow-run-as-root --oversubscribe -np 2 --)
    b=(--config "$cfg/$B_CONFIG.toml" --set 'optim.name="muon"' --set parallel.dp=2 --set parallel.zero_stage=1
       --set train.steps="$B_STEPS" --set train.batch_size="$B_BATCH" --set train.eval_every=$((B_STEPS / 4))
       --set train.eval_batches=32 --set metrics.every=1)
    read -r -a seeds <<<"$B_SEEDS"
    for s in "${seeds[@]}"; do run "B_base_s$s" "${mpi[@]}" "${b[@]}" --set run.seed="$s"; done
    for l in 1 2; do
        run "B_level${l}_s${seeds[0]}" "${mpi[@]}" "${b[@]}" --set run.seed="${seeds[0]}" --set compress.level=$l \
            --set compress.warmup_steps="$B_WARMUP" --set compress.chunk="$B_CHUNK"
    done
    python3 - "$out/runs" "${seeds[@]}" <<'EOF'
import itertools, json, sys
root, seeds = sys.argv[1], sys.argv[2:]
def train(name):
    return {d["step"]: d for d in (json.loads(l) for l in open(f"{root}/{name}/metrics.jsonl")) if d.get("kind") == "train"}
def final_val(name):
    return [json.loads(l) for l in open(f"{root}/{name}/metrics.jsonl") if '"kind":"eval"' in l][-1]["val_loss"]
def dloss(a, b):   # spec §6: mean of (L_a - L_b) over the last 10% of steps
    A, B = train(a), train(b)
    n = max(A); tail = [s for s in A if s > n - n // 10]
    return sum(A[s]["loss"] - B[s]["loss"] for s in tail) / len(tail)
base = [f"B_base_s{s}" for s in seeds]
pairs = [abs(dloss(a, b)) for a, b in itertools.combinations(base, 2)]
floor = sum(pairs) / len(pairs)
vals = [final_val(b) for b in base]
res = {"summary": "B", "noise_floor_mean_pair": round(floor, 5), "noise_floor_max_pair": round(max(pairs), 5),
       "base_final_val": [round(v, 5) for v in vals], "base_final_val_spread": round(max(vals) - min(vals), 5)}
b0 = train(base[0]); raw0 = None
for lvl in (1, 2):
    name = f"B_level{lvl}_s{seeds[0]}"
    t = train(name); last = t[max(t)]
    d = dloss(name, base[0])
    res[f"level{lvl}"] = {"dloss_train_last10pct": float(f"{d:.4g}"), "final_val": round(final_val(name), 5),
                          "dval_final": round(final_val(name) - vals[0], 5),
                          "wire_bytes_per_step": last["compress/wire_bytes"], "raw_bytes_per_step": last["compress/raw_bytes"],
                          "leg_ratio": round(last["compress/raw_bytes"] / last["compress/wire_bytes"], 2),
                          "accepted": abs(d) <= 2 * floor}
# the leg carries the AdamW slices raw (4 B) and the Muon matrices compressed; level 1 sends them at 2 B, so
# raw = 4 (a + m) and wire1 = 4 a + 2 m give the two parts, and level 2's ratio on the matrices alone
raw, w1, w2 = (res["level1"]["raw_bytes_per_step"], res["level1"]["wire_bytes_per_step"],
               res["level2"]["wire_bytes_per_step"])
adamw_part = 2 * w1 - raw
res["leg_adamw_bytes"], res["leg_matrix_bytes_raw"] = adamw_part, raw - adamw_part
res["level2"]["matrix_ratio"] = round((raw - adamw_part) / (w2 - adamw_part), 2)
res["level1"]["matrix_ratio"] = round((raw - adamw_part) / (w1 - adamw_part), 2)
for lvl in (1, 2):   # the first compressed step starts from identical parameters: a wrong reduce shows at once
    t = train(f"B_level{lvl}_s{seeds[0]}"); s = min(k for k, d in t.items() if "compress/wire_bytes" in d)
    res[f"level{lvl}"]["first_compressed_step"] = {
        "step": s, "adamw_grad_norm_bitwise_equal": t[s]["optim/adamw_grad_norm"] == b0[s]["optim/adamw_grad_norm"],
        "muon_grad_norm_rel": float(f'{t[s]["optim/muon_grad_norm"] / b0[s]["optim/muon_grad_norm"] - 1:.3g}')}
print(json.dumps(res))
EOF
fi
