#!/usr/bin/env bash
# One training per run.dir (docs/training.md, "The run directory lock"): a second training in a directory that a
# live run holds ends with exit 2 naming the directory and the holder's PID and host, before it writes anything; a
# lock left by a process that is gone is taken over; the holder itself stops cleanly on SIGTERM and releases it.
# Usage: run_lock.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

# The issue's reproduction: a long run A, and 2 s later the same job with other steps and lr in the same directory.
"$BIN" train "${COMMON[@]}" --set run.dir=R --set train.steps=100000 --set checkpoint.every_steps=5 > a.out 2> a.err &
A=$!
wait_for 60 grep -qs "^pid=$A\$" R/.lock || fail "run A did not record itself in R/.lock: $(cat a.err)"
wait_for 60 grep -q '^step' a.out || fail "run A made no progress: $(cat a.err)"
sleep 2
timeout 60 "$BIN" train "${COMMON[@]}" --set run.dir=R --set train.steps=60 --set train.lr=2e-3 > b.out 2> b.err
rc=$?
[[ $rc -eq 2 ]] || fail "second run in R: exit $rc, expected 2: $(tail -3 b.err)"
[[ $(grep -c '^moetrain: error:' b.err) -eq 1 ]] || fail "expected one error line: $(cat b.err)"
grep -qF 'run.dir = "R" is in use by another training' b.err || fail "the message does not name run.dir: $(cat b.err)"
grep -qF "PID $A on host $(hostname)" b.err || fail "the message does not name PID $A and the host: $(cat b.err)"
grep -q '^step' b.out && fail "the second run trained: $(head -3 b.out)"
[[ $(grep -c '"kind":"config"' R/metrics.jsonl) -eq 1 ]] || fail "metrics.jsonl holds the second run's lines too"
echo "ok (2): $(head -1 b.err)"

# The holder stops on SIGTERM (exit 8, signals.sh covers it in full) and leaves the lock free and empty.
kill -TERM "$A"
wait_exit "$A" 60
rc=$?
[[ $rc -eq 8 ]] || fail "run A after SIGTERM: exit $rc, expected 8: $(tail -3 a.err)"
[[ -s R/.lock ]] && fail "R/.lock still names a holder after a clean exit: $(cat R/.lock)"

# A stale lock: the file names a process that is gone (killed without releasing it). The kernel dropped its flock,
# so the next run takes the lock over and says whose it was.
printf 'pid=999999\nhost=gone-host\n' > R/.lock
last=$(ls R/checkpoints | tail -1)
timeout 120 "$BIN" train "${COMMON[@]}" --set run.dir=R --set train.steps=$((10#${last#step_} + 2)) \
  --set checkpoint.every_steps=0 --resume > c.out 2> c.err
rc=$?
[[ $rc -eq 0 ]] || fail "run over a stale lock: exit $rc: $(tail -3 c.err)"
grep -qF "taking over the lock of PID 999999 on host gone-host" c.out || fail "no takeover note: $(head -3 c.out)"

# A lock held by a process that has not written its PID (here util-linux flock(1)) still stops a second run.
if command -v flock > /dev/null; then
  flock R/.lock sleep 30 > /dev/null 2>&1 &  # not on the script's output, which CTest waits for
  F=$!
  wait_for 10 bash -c "! flock -n R/.lock true" || fail "flock(1) did not take R/.lock"
  timeout 60 "$BIN" train "${COMMON[@]}" --set run.dir=R --set train.steps=1 > d.out 2> d.err
  rc=$?
  [[ $rc -eq 2 ]] || fail "run beside flock(1): exit $rc, expected 2: $(tail -3 d.err)"
  grep -qF "a process that has not written its PID yet" d.err || fail "holder message: $(cat d.err)"
  pkill -P "$F" 2> /dev/null  # flock(1)'s child (sleep) holds the lock
  kill "$F" 2> /dev/null
  wait "$F" 2> /dev/null
fi
finish run_lock
