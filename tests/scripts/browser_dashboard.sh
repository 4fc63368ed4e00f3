#!/usr/bin/env bash
# The live dashboard in headless Chromium (labels script, browser; scripts/install_deps.sh installs chromium): a tiny
# MoE training under `moetrain supervise` with metrics.port set is killed once (a real restart); then the page, loaded
# while the training runs, has drawn every plot (the optional ones only where the run logs their metrics) and shows
# the restart and the alarms; a second load sees more points; a screenshot is saved as dashboard.png in the scratch
# directory. Last, `moetrain dashboard --run` serves the same run after it stopped. About 30 s.
# Usage: browser_dashboard.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"
CHECK=(/usr/bin/python3 "$SRC/tests/scripts/lib/dashboard_check.py")
CHROMIUM=$(command -v chromium || command -v chromium-browser) ||
  { echo "FAIL: chromium is not installed (scripts/install_deps.sh installs it)"; exit 1; }

# chromium_page URL FILE [screenshot PNG]: the page's DOM after 6 s of the page's own time (its polls every 2 s run
# at once; time stands still while a request is pending), or a screenshot.
chromium_page() {
  local url=$1 out=$2 shot=${3:-}
  local args=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --hide-scrollbars
              --user-data-dir="$PWD/chromium-profile" --window-size=1280,1700 --virtual-time-budget=6000)
  if [[ -n $shot ]]; then
    timeout 60 "$CHROMIUM" "${args[@]}" --screenshot="$shot" "$url" > /dev/null 2>> chromium.err
  else
    timeout 60 "$CHROMIUM" "${args[@]}" --dump-dom "$url" > "$out" 2>> chromium.err
  fi
}

steps() { "${CHECK[@]}" metric "$URL" moetrain_steps_total 2> /dev/null | cut -d. -f1; }
restarts() { "${CHECK[@]}" metric "$URL" moetrain_restarts_total 2> /dev/null | cut -d. -f1; }
at_least() { local v; v=$("$1"); [[ -n $v && $v -ge $2 ]]; }

PORT=$("${CHECK[@]}" free-port)
URL="http://127.0.0.1:$PORT"
# Enough steps to outlast the test (SIGTERM ends it); a checkpoint every 10 steps to resume from; loads every step
# for the heat map.
"$BIN" supervise --backoff 0.5 -- "$BIN" train --config "$SRC/configs/tiny_moe.toml" \
  --set 'data.paths=["data/train.bin"]' --set 'data.val_paths=["data/val.bin"]' --set run.dir=run \
  --set run.device=cpu --set run.threads=1 --set train.batch_size=2 --set train.seq_len=32 --set train.steps=100000 \
  --set train.eval_every=10 --set train.eval_batches=1 --set checkpoint.every_steps=10 --set moe.log_loads_every=1 \
  --set metrics.port="$PORT" > supervise.log 2>&1 &
supervisor=$!

wait_for 60 at_least steps 15 || fail "the endpoint never showed 15 steps: $(tail -5 supervise.log)"
trainer=$(/usr/bin/python3 -c 'import json; print(json.load(open("run/heartbeat/rank_0.json"))["pid"])')
kill -KILL "$trainer"
wait_for 60 at_least restarts 1 || fail "no restart reached the endpoint: $(tail -5 supervise.log)"
wait_for 60 at_least steps 25 || fail "the restarted training did not go on: $(tail -5 supervise.log)"

chromium_page "$URL/" first.html
"${CHECK[@]}" dom first.html run/metrics.jsonl --restarts 1 --min-polls 2 > first.txt || fail "first load: $(cat first.txt)"
grep -q 'id="alarms" class="banner" data-count="[1-9]' first.html || fail "no alarm banner (the restart is one)"
sleep 1
chromium_page "$URL/" second.html
"${CHECK[@]}" dom second.html run/metrics.jsonl --restarts 1 --min-polls 2 > second.txt ||
  fail "second load: $(cat second.txt)"
loss_points() { grep -o 'loss=[0-9]*' "$1" | head -1 | cut -d= -f2; }
last_step() { grep -o 'last_step=[0-9]*' "$1" | cut -d= -f2; }
[[ $(loss_points second.txt) -gt $(loss_points first.txt) && $(last_step second.txt) -gt $(last_step first.txt) ]] ||
  fail "the page did not update: $(cat first.txt) then $(cat second.txt)"
chromium_page "$URL/" "" "$PWD/dashboard.png"
[[ $(head -c 8 "$PWD/dashboard.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
  fail "no PNG screenshot at $PWD/dashboard.png"

kill -TERM "$supervisor"
wait_exit "$supervisor" 60
rc=$?
[[ $rc -eq 8 ]] || fail "the supervised training ended with $rc, expected 8 (stopped by SIGTERM): $(tail -5 supervise.log)"

# The finished run, served by `moetrain dashboard` on another free port.
PORT=$("${CHECK[@]}" free-port)
URL="http://127.0.0.1:$PORT"
"$BIN" dashboard --run run --port "$PORT" > dashboard.log 2>&1 &
server=$!
wait_for 20 at_least restarts 1 || fail "moetrain dashboard does not serve the run: $(cat dashboard.log)"
chromium_page "$URL/" finished.html
"${CHECK[@]}" dom finished.html run/metrics.jsonl --restarts 1 > finished.txt || fail "finished run: $(cat finished.txt)"
kill -INT "$server"
wait_exit "$server" 20 || fail "moetrain dashboard did not end with 0 on SIGINT"
echo "first: $(cat first.txt)"
echo "second: $(cat second.txt)"
finish browser_dashboard
