#!/usr/bin/env bash
# The supervisor (docs/operations.md, operations.md §2): a training killed with SIGKILL three times, once each at
# three different steps, is restarted from its newest checkpoint each time and ends with final weights bitwise equal
# to an uninterrupted run's, with a restart event per kill; a stopped (SIGSTOP) trainer is found hung and restarted;
# bad input (exit 2) is not retried; a job that keeps failing is given up after --max-restarts; a SIGTERM to the
# supervisor stops the job at a step boundary with a checkpoint (exit 8).
# Usage: supervise.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

STEPS=40
JOB=("${COMMON[@]}" --set train.batch_size=4 --set train.seq_len=64 --set train.steps=$STEPS
     --set checkpoint.every_steps=4 --set checkpoint.keep_last=100 --set health.heartbeat_s=0.2)
final=$(printf 'checkpoints/step_%08d' $STEPS)
beat_step() { grep -o '"step":[0-9]*' "$1/heartbeat/rank_0.json" 2> /dev/null | tr -dc 0-9; }
beat_pid() { grep -o '"pid":[0-9]*' "$1/heartbeat/rank_${2:-0}.json" 2> /dev/null | tr -dc 0-9; }
export -f beat_step
# expect_recovered SUP LIMIT STRAIGHT DIR CHECKPOINT KILLS: the supervisor SUP ends with 0 within LIMIT seconds, every
# weight file of DIR's CHECKPOINT equals the uninterrupted run STRAIGHT's, and DIR logged one restart per kill.
expect_recovered() {
  local sup=$1 limit=$2 straight=$3 dir=$4 ckpt=$5 kills=$6 rc f n
  wait_exit "$sup" "$limit"
  rc=$?
  [[ $rc -eq 0 ]] || fail "$dir: exit $rc: $(tail -5 "$dir.err")"
  for f in "$straight/$ckpt"/*.safetensors; do
    cmp -s "$f" "$dir/$ckpt/$(basename "$f")" || fail "$dir: final $(basename "$f") differs from the uninterrupted run"
  done
  n=$(grep -c '"event":"restart"' "$dir/metrics.jsonl")
  [[ $n -eq $kills ]] || fail "$dir: $n restart events for $kills kills"
}

"$BIN" train "${JOB[@]}" --set run.dir=straight > straight.out 2>&1 || fail "the uninterrupted run: $(tail -3 straight.out)"

# 1. SIGKILL at three steps; the supervisor restarts each time.
start=$SECONDS
"$BIN" supervise --backoff 0.1 --hang-timeout 120 -- "$BIN" train "${JOB[@]}" --set run.dir=killed > killed.out 2> killed.err &
sup=$!
for at in 6 17 29; do
  wait_for 120 bash -c "s=\$(beat_step killed); [[ -n \$s && \$s -ge $at ]]" || { fail "no step $at: $(tail -3 killed.err)"; break; }
  pid=$(beat_pid killed)
  kill -KILL "$pid" && echo "killed the trainer (pid $pid) at step $(beat_step killed)"
done
expect_recovered $sup 300 straight killed "$final" 3
grep -q '"event":"recovered"' killed/metrics.jsonl || fail "no recovered event"
echo "ok (0): 3 kills, final weights equal the uninterrupted run's; $((SECONDS - start)) s in all; $(grep '"event":"restart"' killed/metrics.jsonl | grep -o '"steps_lost":[0-9]*' | tr '\n' ' ')$(grep -o '"time_to_recover_s":[0-9.]*' killed/metrics.jsonl | tr '\n' ' ')"

# 2. A stopped trainer is hung: killed after the launch config's health.hang_timeout_s (health.kill_grace_s between
# SIGTERM and SIGKILL) and restarted.
"$BIN" supervise --backoff 0.1 -- "$BIN" train "${JOB[@]}" --set run.dir=hung --set health.hang_timeout_s=2 \
  --set health.kill_grace_s=1 > hung.out 2> hung.err &
sup=$!
wait_for 120 bash -c "s=\$(beat_step hung); [[ -n \$s && \$s -ge 5 ]]" || fail "hang: no progress"
pid=$(beat_pid hung)
kill -STOP "$pid"
wait_exit $sup 300
rc=$?
[[ $rc -eq 0 ]] || fail "hang: exit $rc: $(tail -3 hung.err)"
grep -q '"event":"restart".*"reason":"hang"' hung/metrics.jsonl || grep -q '"reason":"hang"' hung/metrics.jsonl ||
  fail "hang: no restart event with reason hang"
echo "ok (0): a stopped trainer was found hung and restarted"

# 3. Bad input is not retried: a bad config is refused by the supervisor itself (it reads the run.dir from it), a
# missing data file (exit 3) ends the job once, with no restart.
"$BIN" supervise --backoff 0 -- "$BIN" train "${JOB[@]}" --set run.dir=bad --set train.lr=-1 > bad.out 2> bad.err
rc=$?
[[ $rc -eq 2 ]] || fail "bad config: exit $rc, expected 2: $(cat bad.err)"
[[ $(grep -c '^moetrain: error:' bad.err) -eq 1 ]] || fail "bad config: expected one error line: $(cat bad.err)"
"$BIN" supervise --backoff 0 -- "$BIN" train "${JOB[@]}" --set run.dir=nodata --set 'data.paths=["nope.bin"]' \
  > nodata.out 2> nodata.err
rc=$?
[[ $rc -eq 3 ]] || fail "missing data: exit $rc, expected 3: $(cat nodata.err)"
grep -q 'not restarted' nodata.err || fail "missing data: no 'not restarted' line: $(cat nodata.err)"
[[ $(grep -c '^moetrain: error:' nodata.err) -eq 1 ]] || fail "missing data: expected one attempt: $(cat nodata.err)"
echo "ok (2, 3): bad input is not retried"

# 4. A job that keeps failing is given up after --max-restarts.
"$BIN" supervise --backoff 0 --max-restarts 2 --run-dir gaveup -- sh -c 'exit 5' > gaveup.out 2> gaveup.err
rc=$?
[[ $rc -eq 5 ]] || fail "give up: exit $rc, expected 5"
[[ $(grep -c '"event":"restart"' gaveup/metrics.jsonl) -eq 2 ]] || fail "give up: expected 2 restarts"
grep -q '"event":"gave_up"' gaveup/metrics.jsonl || fail "give up: no gave_up event"
echo "ok (5): given up after 2 restarts"

# 5. SIGTERM to the supervisor: the job stops after a checkpoint, exit 8, no restart.
"$BIN" supervise --backoff 0 -- "$BIN" train "${JOB[@]}" --set run.dir=term --set train.steps=100000 > term.out 2> term.err &
sup=$!
wait_for 120 bash -c "s=\$(beat_step term); [[ -n \$s && \$s -ge 3 ]]" || fail "term: no progress"
kill -TERM $sup
wait_exit $sup 120
rc=$?
[[ $rc -eq 8 ]] || fail "term: exit $rc, expected 8: $(tail -3 term.err)"
grep -q '"event":"stopped"' term/metrics.jsonl || fail "term: no stopped event"
grep -q '"event":"restart"' term/metrics.jsonl && fail "term: restarted after a stop"
echo "ok (8): SIGTERM stops the job with a checkpoint"

# 6. Seventeen more kills, twenty in all: twelve of the single process at steps apart by 1-3 with a checkpoint every
# step (so that kills land in checkpoint writes too: a checkpoint without DONE is never resumed from), and five of
# one rank of an `mpirun -np 4` job (mpirun then ends the job). Both end bitwise equal to their uninterrupted runs.
# kill_trials DIR N SUP_PID: N SIGKILLs of a random rank's trainer, each once the job has gone 1-3 steps past the last.
kill_trials() {
  local dir=$1 n=$2 sup=$3 ranks=$4 k at=0 rank pid
  for ((k = 0; k < n; ++k)); do
    at=$((at + 1 + RANDOM % 3))
    wait_for 180 bash -c "s=\$(beat_step $dir); [[ -n \$s && \$s -ge $at ]]" || { fail "$dir: no step $at"; return; }
    rank=$((RANDOM % ranks))
    pid=$(beat_pid "$dir" "$rank")
    kill -0 "$sup" 2> /dev/null || { fail "$dir: the supervisor ended early"; return; }
    kill -KILL "$pid" 2> /dev/null
    at=$(beat_step $dir)
  done
}
MANY=("${COMMON[@]}" --set train.batch_size=4 --set train.seq_len=64 --set train.steps=60
      --set checkpoint.every_steps=1 --set checkpoint.keep_last=2 --set health.heartbeat_s=0.2)
last=$(printf 'checkpoints/step_%08d' 60)
"$BIN" train "${MANY[@]}" --set run.dir=many_straight > many_straight.out 2>&1 || fail "many: the uninterrupted run"
"$BIN" supervise --backoff 0.05 --max-restarts 20 --hang-timeout 120 -- "$BIN" train "${MANY[@]}" --set run.dir=many > many.out 2> many.err &
sup=$!
kill_trials many 12 $sup 1
expect_recovered $sup 600 many_straight many "$last" 12
echo "ok (0): 12 kills of the single process: 12 restarts ($(grep -c '"event":"restart".*"phase":"checkpoint"' many/metrics.jsonl) in a checkpoint write), final weights equal"

MPI=(mpirun --allow-run-as-root --oversubscribe -np 4)
"${MPI[@]}" "$BIN" train "${MANY[@]}" --set run.dir=mpi_straight > mpi_straight.out 2>&1 || fail "mpi: the uninterrupted run"
"$BIN" supervise --backoff 0.05 --max-restarts 20 --hang-timeout 120 -- "${MPI[@]}" "$BIN" train "${MANY[@]}" --set run.dir=mpi \
  > mpi.out 2> mpi.err &
sup=$!
kill_trials mpi 5 $sup 4
expect_recovered $sup 600 mpi_straight mpi "$last" 5
echo "ok (0): 5 kills of one rank of mpirun -np 4: 5 restarts, final weights equal"

finish supervise
