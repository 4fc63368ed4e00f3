#!/usr/bin/env bash
# The operations benchmarks of docs/PERFORMANCE.md "Checkpoints and metrics" (issue 27) on one GPU, as JSON lines.
#   checkpoint  moetrain train CONFIG over a random-token shard with metrics every step and one checkpoint at step
#               EVERY (async or blocking), stopped (SIGKILL) EXTRA steps after that checkpoint's event, so the run's
#               last checkpoint (always blocking) is never written: the event's blocking_seconds (the loop's wait)
#               and write_seconds (the background write), and the step times before, during and after the write.
#   metrics     moetrain train CONFIG for STEPS steps without checkpoints at metrics.every = 1 and 10 and with the
#               metrics off (layer_stats off, no metrics.jsonl): the loop's time per step over steps 6..STEPS from
#               the time stamps of the console step lines (printed line-buffered), so the metric work, the JSONL and
#               TensorBoard writes are all in it.
#   bench/checkpoint_cost.sh BUILD_DIR checkpoint CONFIG [async|blocking] [EVERY] [EXTRA]
#   restart     moetrain supervise over the same training with an async checkpoint every EVERY steps: EXTRA steps after
#               the first checkpoint the training process gets SIGKILL; the supervisor restarts it from that
#               checkpoint. The downtime (the kill to the restarted job's first completed step, with its setup and
#               the checkpoint's load), the steps lost, and the expected lost progress per failure of a 10,000-step
#               job with checkpoints every EVERY steps (operations.md §3: EVERY / 2 + the downtime in steps).
#   bench/checkpoint_cost.sh BUILD_DIR metrics CONFIG [STEPS]
#   bench/checkpoint_cost.sh BUILD_DIR restart CONFIG [EVERY] [EXTRA]
# RUN_DIR_SHM=1 (checkpoint): the run directory in /dev/shm, its checkpoints/ a link to the disk.
# KEEP_LOG=FILE (restart): a copy of the supervised run's output (both runs', with the resume's "read in" line).
# TRAIN_SET="key=value ..." : extra --set options for the training runs (e.g. moe.grouped_gemm=\"device\").
# EVERY (checkpoint.every_steps) must exceed the write's length in steps: a checkpoint due while the one before it is
# being written waits for it (docs/configs.md), and the first event's blocking_seconds is then that wait
# ("back_pressure": true in the line, and a hint on stderr). kimi_linear_mini on one GPU writes ~31 GB in ~27 s, about
# 100 steps, so EVERY 150:
# e.g. bench/checkpoint_cost.sh build checkpoint configs/kimi_linear_mini.toml async 150 6
# A kimi_linear_mini checkpoint is about 31 GB: one run at a time on a 64 GB disk (each run's directory is removed).
set -uo pipefail
build=$1 what=$2 config=$3
shift 3
bin=$build/moetrain
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# 2^20 random tokens below the config's vocabulary (at most 65536) in the llm.c uint16 shard format.
python3 - "$work/rand.bin" "$config" <<'PY'
import random, struct, sys, tomllib
vocab = min(tomllib.load(open(sys.argv[2], "rb")).get("model", {}).get("vocab_size", 257), 65536)
n = 1 << 20
rng = random.Random(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(rng.randrange(vocab) for _ in range(n))))
PY
common=(--config "$config" --set "data.paths=[\"$work/rand.bin\"]" --set 'data.val_paths=[]' --set train.eval_every=0
        --set run.deterministic=false --set data.document_mask=false)
# TRAIN_SET="key=value ...": more --set options for every run (no spaces inside a value)
read -r -a train_set <<< "${TRAIN_SET:-}"  # split on spaces only (no glob expansion)
for kv in "${train_set[@]}"; do common+=(--set "$kv"); done

# train_lines DIR: how many train lines DIR's metrics.jsonl holds so far
train_lines() {
    local n
    n=$(grep -c '"kind":"train"' "$1/metrics.jsonl" 2> /dev/null)
    echo "${n:-0}"
}
# after_first_checkpoint PID DIR EXTRA: waits (while PID lives, at most 900 s) for the first checkpoint event in DIR's
# metrics.jsonl, then for EXTRA more train lines; prints that event's step, nothing when none came
after_first_checkpoint() {
    local pid=$1 dir=$2 extra=$3 deadline=$((SECONDS + 900)) at
    until grep -q '"event":"checkpoint"' "$dir/metrics.jsonl" 2> /dev/null; do
        kill -0 "$pid" 2> /dev/null && ((SECONDS < deadline)) || return 0
        sleep 0.5
    done
    at=$(grep -m1 '"event":"checkpoint"' "$dir/metrics.jsonl" | sed 's/.*"step":\([0-9]*\).*/\1/')
    while kill -0 "$pid" 2> /dev/null && ((SECONDS < deadline)) && (($(train_lines "$dir") < at + extra)); do
        sleep 0.5
    done
    echo "$at"
}

case $what in
checkpoint)
    mode=${1:-async} every=${2:-4} extra=${3:-6}
    dir=$work/run
    if [[ -n ${RUN_DIR_SHM:-} ]]; then
        # The run directory (metrics.jsonl, the heartbeat) in memory and only its checkpoints/ on the disk: whether
        # the steps beside a write wait for the loop's own small file writes behind the checkpoint's writeback.
        dir=$(mktemp -d /dev/shm/ckpt_run.XXXXXX)
        trap 'rm -rf "$work" "$dir"' EXIT
        mkdir -p "$work/checkpoints" && ln -s "$work/checkpoints" "$dir/checkpoints"
    fi
    "$bin" train "${common[@]}" --set train.steps=100000 --set checkpoint.every_steps="$every" \
        --set checkpoint.async="$([[ $mode == async ]] && echo true || echo false)" --set checkpoint.keep_last=1 \
        --set metrics.every=1 --set run.dir="$dir" > "$work/train.log" 2>&1 &
    pid=$!
    at=$(after_first_checkpoint $pid "$dir" "$extra")
    kill -KILL $pid 2> /dev/null
    wait $pid 2> /dev/null
    [[ -n $at ]] || { echo "{\"bench\": \"checkpoint\", \"config\": \"$config\", \"error\": \"no checkpoint event\"}"; tail -5 "$work/train.log" >&2; exit 1; }
    python3 - "$dir/metrics.jsonl" "$config" "$mode" "$every" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ev = next(r for r in rows if r.get("event") == "checkpoint")
steps = {r["step"]: r["step_seconds"] for r in rows if r.get("kind") == "train"}
every, done = int(sys.argv[4]), ev["step"]
before = [s for k, s in steps.items() if 2 <= k <= every]        # after the first (allocating) step
during = [s for k, s in steps.items() if every < k <= done]      # the steps the background write ran beside
after = [s for k, s in steps.items() if k > done]
med = lambda v: statistics.median(v) if v else None
# The event is written when the write is finished: found done at a step boundary (the loop did not wait), or by the
# next checkpoint, which waits for it (a checkpoint due while one is being written waits: back-pressure). The second
# case measures the wait for the previous write, not a checkpoint's cost: EVERY is then too short for this write.
phases = ev.get("phases", {})
call = sum(phases.values()) if phases else None                  # the checkpoint call itself
finish_wait = ev["blocking_seconds"] - call if call is not None else None
back_pressure = sys.argv[3] == "async" and done >= 2 * every
print(json.dumps({"bench": "checkpoint", "config": sys.argv[2], "mode": sys.argv[3], "every": every,
                  "blocking_seconds": ev["blocking_seconds"], "write_seconds": ev["write_seconds"],
                  "call_seconds": call, "finish_wait_seconds": finish_wait, "phases": phases,
                  "reservation_seconds": ev.get("reservation_seconds"),
                  "reservation_wait_seconds": ev.get("reservation_wait_seconds"),
                  "event_step": done, "back_pressure": back_pressure,
                  "step_s_before": med(before), "step_s_during": med(during), "step_s_after": med(after),
                  "steps_during": len(during)}))
if back_pressure:
    print(f"checkpoint_cost.sh: the write outlasted the {every}-step interval (event at step {done}): "
          f"blocking_seconds is the next checkpoint's wait for it; rerun with EVERY above "
          f"{int(ev['write_seconds'] / max(med(during) or 1, 1e-9)) + 1}", file=sys.stderr)
PY
    du -sbL "$dir/checkpoints" 2> /dev/null | awk '{printf "{\"bench\": \"checkpoint_bytes\", \"bytes\": %s}\n", $1}'
    ;;
metrics)
    steps=${1:-20}
    for case in every1 every10 off; do
        case $case in
        every1) set_=(--set metrics.every=1 --set metrics.layer_stats=true) ;;
        every10) set_=(--set metrics.every=10 --set metrics.layer_stats=true) ;;
        off) set_=(--set metrics.every=1000000 --set metrics.layer_stats=false --set metrics.jsonl=false) ;;
        esac
        rm -rf "$work/run"
        stdbuf -oL "$bin" train "${common[@]}" --set train.steps="$steps" --set checkpoint.every_steps=0 \
            --set run.dir="$work/run" "${set_[@]}" 2>&1 | while IFS= read -r l; do echo "$(date +%s.%N) $l"; done \
            > "$work/$case.log"
        python3 - "$work/$case.log" "$case" "$config" "$work/run/metrics.jsonl" <<'PY'
import json, os, re, sys
t = {}
for l in open(sys.argv[1]):
    m = re.match(r"(\S+) step\s+(\d+)/", l)
    if m: t[int(m.group(2))] = float(m.group(1))
if len(t) < 2:
    sys.exit(f"checkpoint_cost.sh metrics: no step lines in {sys.argv[1]}")
lo, hi = (6 if 6 in t else min(t)), max(t)
fields = 0
if os.path.exists(sys.argv[4]):
    for l in open(sys.argv[4]):
        if '"kind":"train"' in l: fields = max(fields, len(json.loads(l)))
print(json.dumps({"bench": "metrics_cost", "config": sys.argv[3], "case": sys.argv[2],
                  "ms_per_step": 1000 * (t[hi] - t[lo]) / (hi - lo), "steps": [lo, hi], "train_line_fields": fields}))
PY
    done
    ;;
restart)
    every=${1:-150} extra=${2:-6}
    dir=$work/run
    "$bin" supervise --max-restarts 1 --backoff 1 -- "$bin" train "${common[@]}" --set train.steps=100000 \
        --set checkpoint.every_steps="$every" --set checkpoint.async=true --set checkpoint.keep_last=1 \
        --set metrics.every=1 --set run.dir="$dir" > "$work/train.log" 2>&1 &
    sup=$!
    at=$(after_first_checkpoint $sup "$dir" "$extra")
    deadline=$((SECONDS + 900))
    job=$(pgrep -P $sup | head -1)
    [[ -n $at && -n $job ]] || { echo '{"bench": "restart", "error": "no checkpoint or no job"}'; kill -KILL $sup; tail -5 "$work/train.log" >&2; exit 1; }
    # The failure: SIGKILL to the training process; the supervisor restarts it with --resume.
    t_kill=$(date +%s.%N)
    kill -KILL "$job"
    n_before=$(train_lines "$dir")
    # The first resumed step, and five more: their step time beside the snapshot buffers' background reservation.
    until (($(train_lines "$dir") > n_before + 5)) || ((SECONDS >= deadline)); do sleep 0.2; done
    # Then the supervisor and the restarted job's process group (SIGKILL: no final checkpoint to write).
    job2=$(pgrep -P $sup | head -1)
    kill -KILL $sup 2> /dev/null
    [[ -n $job2 ]] && kill -KILL -- "-$(ps -o pgid= "$job2" | tr -d ' ')" 2> /dev/null
    wait $sup 2> /dev/null
    [[ -n ${KEEP_LOG:-} ]] && cp "$work/train.log" "$KEEP_LOG"   # the supervisor's and both runs' output
    python3 - "$dir/metrics.jsonl" "$config" "$every" "$t_kill" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
every, t_kill = int(sys.argv[3]), float(sys.argv[4])
ev = next(r for r in rows if r.get("event") == "restart")
train = [r for r in rows if r.get("kind") == "train"]
first = next(r for r in train if r["time"] > t_kill)        # the restarted job's first completed step
step_s = statistics.median(r["step_seconds"] for r in train if r["time"] < t_kill and r["step"] >= 2)
downtime = first["time"] - t_kill
resumed = next((r for r in rows if r.get("event") == "resumed" and r["time"] > t_kill), {})
config = next((r for r in rows if r.get("kind") == "config" and r["time"] > t_kill), {})   # the restarted job's
# spec (operations.md §3): lost progress per failure = steps since the last checkpoint (K / 2 on average for a
# failure at a random step) + the downtime in steps, as a fraction of a 10,000-step job.
lost = (every / 2 + downtime / step_s) / 10000
print(json.dumps({"bench": "restart", "config": sys.argv[2], "every": every, "steps_lost": ev.get("steps_lost"),
                  "resumed_step": ev.get("resumed_step"), "supervisor_downtime_s": ev.get("downtime_s"),
                  "downtime_s": downtime, "first_step_after": first["step"], "step_s": step_s,
                  # the downtime's parts: the kill to the resumed job's `resumed` event (start, setup, the load),
                  # the load itself (its CRC pass and reads), and that event to the first completed step
                  # the killed process's exit (its host memory and GPU context released), then the backoff
                  "to_restart_event_s": ev["time"] - t_kill,
                  "to_resumed_event_s": resumed["time"] - t_kill if resumed else None,
                  "load_seconds": resumed.get("load_seconds"),
                  # of which the files' CRC-32C checks and the finiteness checks (the rest: reading into the state)
                  "load_crc_seconds": resumed.get("load_crc_seconds"),
                  "load_check_seconds": resumed.get("load_check_seconds"),
                  "checkpoint_reserve_seconds": config.get("checkpoint_reserve_seconds"),
                  "resumed_event_to_first_step_s": first["time"] - resumed["time"] if resumed else None,
                  # the resumed job's steps after its first (the reservation of the snapshot buffers runs beside them)
                  "step_s_after_restart": statistics.median([r["step_seconds"] for r in train
                                                             if r["time"] > first["time"]] or [0]),
                  "expected_lost_fraction_10k": lost}))
PY
    ;;
*) echo "checkpoint_cost.sh: unknown benchmark $what (checkpoint, metrics, restart)" >&2; exit 2 ;;
esac
