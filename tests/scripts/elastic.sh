#!/usr/bin/env bash
# Elastic resume (docs/operations.md "Elastic resume", operations.md §3): an `mpirun -np 4` job on two simulated
# hosts of two slots (a, b) loses host b: both of its ranks are killed with SIGKILL and its probe fails from then
# on. The supervisor restarts the job on host a's two ranks with grad_accum doubled (the global batch kept), then,
# once b's probe has passed for --grow-after seconds, stops the job at a checkpoint and restarts it on all four
# ranks. The run completes, and its loss at every step matches the uninterrupted four-rank run's (f32: the sums
# are taken in another order on two ranks).
# Usage: elastic.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

STEPS=150
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4)
JOB=("${COMMON[@]}" --set train.steps=$STEPS --set train.lr=3e-4 --set train.grad_accum=2 --set checkpoint.every_steps=10
     --set checkpoint.keep_last=3 --set health.heartbeat_s=0.2)
beat() { grep -o "\"$2\":[0-9]*" "el/heartbeat/rank_$1.json" 2> /dev/null | tr -dc 0-9; }
export -f beat

start=$SECONDS
"${MPI[@]}" "$BIN" train "${JOB[@]}" --set run.dir=straight > straight.out 2>&1 || fail "the uninterrupted run failed: $(tail -3 straight.out)"
"$BIN" supervise --backoff 0.1 --hang-timeout 120 --min-ranks 2 --hosts a:2,b:2 --grow-after 2 \
  --probe "test ! -e $PWD/{host}.down" -- "${MPI[@]}" "$BIN" train "${JOB[@]}" --set run.dir=el > el.out 2> el.err &
sup=$!
wait_for 120 bash -c 's=$(beat 0 step); [[ -n $s && $s -ge 40 ]]' || fail "no step 40: $(tail -3 el.err)"
touch b.down
kill -KILL "$(beat 2 pid)" "$(beat 3 pid)" && echo "killed host b's ranks 2 and 3 at step $(beat 0 step)"
wait_for 120 grep -q '"event":"restart".*"ranks":2' el/metrics.jsonl || fail "no restart on 2 ranks: $(tail -3 el.err)"
# Some steps on two ranks, then host b comes back.
resumed=$(grep -o '"event":"restart".*' el/metrics.jsonl | grep -o '"resumed_step":[0-9]*' | tail -1 | tr -dc 0-9)
wait_for 120 bash -c "s=\$(beat 0 step); [[ -n \$s && \$s -ge $((resumed + 15)) ]]" || fail "no progress on 2 ranks"
rm -f b.down
wait_exit $sup 300
rc=$?
[[ $rc -eq 0 ]] || fail "the supervisor ended with $rc: $(tail -5 el.err)"
grep -q '"event":"grow".*"ranks":4' el/metrics.jsonl || fail "no grow event back to 4 ranks"
grep -q '"grad_accum":4' el/metrics.jsonl || fail "the 2-rank world did not double grad_accum"
# The loss of every step (a step redone after a restart: its last line) against the uninterrupted run's.
/usr/bin/python3 - straight/metrics.jsonl el/metrics.jsonl $STEPS << 'PY' || fail "the loss curves differ"
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        j = json.loads(line)
        if j["kind"] == "train": out[j["step"]] = j["loss"]
    return out
a, b, steps = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
missing = [s for s in range(1, steps + 1) if s not in a or s not in b]
if missing: sys.exit(f"steps without a train line: {missing[:5]}")
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in range(1, steps + 1))
print(f"loss curve over {steps} steps: worst relative difference {worst:.2e}")
sys.exit(0 if worst < 1e-3 else 1)
PY
echo "ok: shrink to 2 ranks and grow back to 4 in $((SECONDS - start)) s: $(grep -o '"event":"\(restart\|grow\)"[^}]*' el/metrics.jsonl | grep -o '"\(event\|ranks\|grad_accum\|resumed_step\)":[^,]*' | tr '\n' ' ')"
finish elastic
