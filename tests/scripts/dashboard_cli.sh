#!/usr/bin/env bash
# `moetrain dashboard --run DIR` and the training's endpoint settings, from the command line: a finished run served
# (its steps in /metrics and /api/series), a line appended later followed, SIGINT ends it with 0; a taken port is exit
# 2 naming --port or metrics.port; a missing run, a bad address (exit 2) and a non-loopback bind (a warning).
# Usage: dashboard_cli.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"
CHECK=(/usr/bin/python3 "$SRC/tests/scripts/lib/dashboard_check.py")
steps() { "${CHECK[@]}" metric "$URL" moetrain_steps_total 2> /dev/null | cut -d. -f1; }
is_step() { [[ $(steps) == "$1" ]]; }

"$BIN" train "${COMMON[@]}" --set run.dir=run --set train.steps=6 --set train.eval_every=3 > train.log ||
  { echo "FAIL: training: $(cat train.log)"; exit 1; }

PORT=$("${CHECK[@]}" free-port)
URL="http://127.0.0.1:$PORT"
"$BIN" dashboard --run run --port "$PORT" > dashboard.log 2>&1 &
server=$!
wait_for 20 is_step 6 || fail "the finished run is not served: $(cat dashboard.log)"
grep -q "serving run/metrics.jsonl at $URL/" dashboard.log || fail "no URL printed: $(cat dashboard.log)"
[[ $("${CHECK[@]}" points "$URL" train/loss) -eq 6 ]] || fail "train/loss does not have 6 points"
[[ $("${CHECK[@]}" points "$URL" eval/loss) -eq 2 ]] || fail "eval/loss does not have 2 points"
# A line written later (a run still going) is served within a few seconds.
echo '{"kind":"train","loss":1.0,"step":7,"time":1.0}' >> run/metrics.jsonl
wait_for 10 is_step 7 || fail "the appended step 7 was not followed"

# The port is taken now: a second server and a training asking for it end with exit 2 naming the setting.
"$BIN" dashboard --run run --port "$PORT" > taken.out 2> taken.err
rc=$?
[[ $rc -eq 2 ]] || fail "a second dashboard on a taken port: exit $rc, expected 2"
grep -q -- "--port = $PORT" taken.err && grep -qi "in use" taken.err || fail "the error does not name --port: $(cat taken.err)"
"$BIN" train "${COMMON[@]}" --set run.dir=taken --set train.steps=2 --set metrics.port="$PORT" > taken.out 2> taken.err
rc=$?
[[ $rc -eq 2 ]] || fail "a training on a taken port: exit $rc, expected 2"
grep -q "metrics.port = $PORT" taken.err || fail "the error does not name metrics.port: $(cat taken.err)"

kill -INT "$server"
wait_exit "$server" 20
rc=$?
[[ $rc -eq 0 ]] || fail "moetrain dashboard ended with $rc on SIGINT, expected 0"

"$BIN" dashboard --run nowhere > missing.out 2> missing.err
rc=$?
[[ $rc -eq 2 ]] && grep -q "no metrics log in the run directory \[nowhere/metrics.jsonl\]" missing.err ||
  fail "a missing run: exit $rc: $(cat missing.err)"
"$BIN" dashboard --run run --bind localhost > bad.out 2> bad.err
rc=$?
[[ $rc -eq 2 ]] && grep -q -- '--bind "localhost" is not a numeric' bad.err || fail "--bind localhost: exit $rc: $(cat bad.err)"
bad_setting 'metrics.bind = "localhost" is not a numeric IPv4 or IPv6 address' 'metrics.bind="localhost"'
bad_setting "metrics.port" metrics.port=70000

# Any address but loopback is served with a warning.
PORT=$("${CHECK[@]}" free-port)
"$BIN" train "${COMMON[@]}" --set run.dir=open --set train.steps=2 --set metrics.port="$PORT" \
  --set metrics.bind=0.0.0.0 > open.log 2>&1 || fail "a training bound to 0.0.0.0 failed: $(cat open.log)"
grep -q 'warning: metrics.bind = "0.0.0.0" serves the metrics and the dashboard to other machines' open.log ||
  fail "no warning for metrics.bind = 0.0.0.0: $(cat open.log)"
grep -q "metrics and dashboard at http://0.0.0.0:$PORT/" open.log || fail "no URL printed: $(cat open.log)"
finish dashboard_cli
