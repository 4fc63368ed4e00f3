#!/usr/bin/env bash
# Signals (docs/training.md, "Signals and preemption"): SIGTERM or SIGINT lets the step in progress finish, writes
# a checkpoint of it, says so in one line and exits 8, from which --resume continues; a second signal stops at
# once; under mpirun a signal to one rank stops every rank at the same step; a fatal signal prints a banner in a
# single-process run too; and under mpirun an error every rank hits is printed once.
# Usage: signals.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

# stop_case SIG: a long run, SIG once it has made progress, then the checks.
stop_case() {
  local sig=$1 dir=R_$1 pid rc n step
  "$BIN" train "${COMMON[@]}" --set run.dir=$dir --set train.steps=100000 > $dir.out 2> $dir.err &
  pid=$!
  wait_for 60 bash -c "[[ \$(grep -c '^step' $dir.out 2> /dev/null) -ge 3 ]]" || fail "$sig: no progress: $(cat $dir.err)"
  kill -s $sig $pid
  wait_exit $pid 60
  rc=$?
  [[ $rc -eq 8 ]] || { fail "$sig: exit $rc, expected 8: $(tail -3 $dir.err)"; return; }
  grep -qF "$sig received: stopping after the current step" $dir.err || fail "$sig: no acknowledgement: $(cat $dir.err)"
  n=$(grep -c "^moetrain: stopped by $sig after step" $dir.out)
  [[ $n -eq 1 ]] || fail "$sig: expected one 'stopped' line, got $n: $(tail -3 $dir.out)"
  step=$(grep -o "^step *[0-9]*/" $dir.out | tail -1 | tr -dc 0-9)
  grep -qF "stopped by $sig after step $step of 100000: checkpoint $dir/checkpoints/$(printf step_%08d $step)" $dir.out ||
    fail "$sig: the stop line does not name the checkpoint of the last step $step: $(tail -2 $dir.out)"
  [[ -f $dir/checkpoints/$(printf step_%08d $step)/DONE ]] || fail "$sig: no complete checkpoint at step $step"
  grep -q "\"event\":\"stopped\".*\"signal\":\"$sig\"" $dir/metrics.jsonl || fail "$sig: no stopped event in metrics"
  # The preempted job is requeued: --resume continues from the stop step.
  timeout 120 "$BIN" train "${COMMON[@]}" --set run.dir=$dir --set train.steps=$((step + 2)) --resume > $dir.2.out 2>&1 ||
    fail "$sig: resume after the stop failed: $(tail -3 $dir.2.out)"
  grep -qF "resumed from $dir/checkpoints/$(printf step_%08d $step) at step $step" $dir.2.out ||
    fail "$sig: did not resume from the stop step: $(head -3 $dir.2.out)"
  echo "ok (8): $sig at step $step: $(grep '^moetrain: stopped' $dir.out)"
}
stop_case SIGTERM
stop_case SIGINT

# A second signal stops at once. The first arrives while the run checks a very long validation set at start
# (before any step), so the process is still busy when the second comes.
LONG_START=(--set train.eval_every=1 --set train.eval_batches=100000000 --set train.steps=5)
"$BIN" train "${COMMON[@]}" --set run.dir=R_twice "${LONG_START[@]}" > twice.out 2> twice.err &
pid=$!
wait_for 60 grep -qs "^pid=$pid\$" R_twice/.lock || fail "second signal: the run did not start"
sleep 0.5
kill -TERM $pid
wait_for 30 grep -q "SIGTERM received" twice.err || fail "second signal: the first was not acknowledged"
kill -TERM $pid
wait_exit $pid 30
rc=$?
[[ $rc -eq 143 ]] || fail "second SIGTERM: exit $rc, expected 143 (killed by SIGTERM)"
echo "ok ($rc): the second SIGTERM ended the run at once"

# A fatal signal in a single-process run: a banner naming it and the backtrace, then death by the signal.
"$BIN" train "${COMMON[@]}" --set run.dir=R_segv "${LONG_START[@]}" > segv.out 2> segv.err &
pid=$!
wait_for 60 grep -qs "^pid=$pid\$" R_segv/.lock || fail "SIGSEGV: the run did not start"
kill -SEGV $pid
wait_exit $pid 30
rc=$?
[[ $rc -eq 139 ]] || fail "SIGSEGV: exit $rc, expected 139"
grep -qF "moetrain: error: fatal signal SIGSEGV (sent by process" segv.err || fail "no fatal-signal banner: $(head -3 segv.err)"
echo "ok ($rc): $(head -1 segv.err)"

if command -v mpirun > /dev/null; then
  MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
  # SIGTERM to rank 1 only (as when a scheduler's signal reaches one node first): both ranks agree on the step,
  # write its checkpoint together and exit 8.
  "${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=R_mpi --set train.steps=100000 > mpi.out 2> mpi.err &
  mpi=$!
  wait_for 90 bash -c "[[ \$(grep -c '^step' mpi.out 2> /dev/null) -ge 3 ]]" || fail "mpirun: no progress: $(cat mpi.err)"
  rank1=""
  for p in $(pgrep -f "run.dir=R_mpi"); do
    tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$p
  done
  [[ -n $rank1 ]] || fail "mpirun: rank 1 not found"
  kill -TERM $rank1
  wait_exit $mpi 90
  rc=$?
  [[ $rc -eq 8 ]] || fail "mpirun, SIGTERM to rank 1: exit $rc, expected 8: $(tail -5 mpi.err)"
  step=$(grep -o "^step *[0-9]*/" mpi.out | tail -1 | tr -dc 0-9)
  ck=R_mpi/checkpoints/$(printf step_%08d "$step")
  [[ -f $ck/DONE && -f $ck/rank_00001.safetensors ]] || fail "mpirun: no complete two-rank checkpoint at step $step"
  grep -q "stopped by SIGTERM after step $step of" mpi.out || fail "mpirun: no stop line: $(tail -3 mpi.out)"
  echo "ok ($rc): mpirun, SIGTERM to rank 1: both ranks stopped after step $step"

  # An error every rank hits (a config key typo) is printed once, by rank 0.
  timeout 60 "${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=R_bad --set train.stpes=3 > bad.out 2> bad.err
  rc=$?
  [[ $rc -eq 2 ]] || fail "mpirun, config typo: exit $rc, expected 2: $(cat bad.err)"
  n=$(grep -c '^moetrain: error:' bad.err)
  [[ $n -eq 1 ]] || fail "mpirun, config typo: $n error lines, expected 1: $(grep '^moetrain' bad.err)"
  echo "ok ($rc): mpirun: $(grep '^moetrain: error:' bad.err)"
else
  echo "signals: mpirun not found; the multi-rank cases are skipped"
fi
finish signals
