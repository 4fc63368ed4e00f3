# Shared setup of the CLI scripts that start trainings and interfere with them (run_lock.sh, signals.sh,
# data_guard.sh, disk_full.sh): absolute paths, a scratch directory with a small byte-level corpus, a tiny job
# and helpers that bound every wait. Sourced, not run: `source lib/cli_common.sh "$@"` with the script's
# <moetrain> <source-dir> <scratch-dir>.
set -uo pipefail
BIN=$(realpath -- "$1")
SRC=$(realpath -- "$2")
SCRATCH=$3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
cd "$SCRATCH"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# finish NAME: the script's verdict and exit code.
finish() {
  [[ $failures -eq 0 ]] || { echo "$1: $failures failures"; exit 1; }
  echo "$1: ok"
  exit 0
}

# wait_for SECONDS COMMAND...: polls the command every 0.1 s until it succeeds; fails after SECONDS.
wait_for() {
  local limit=$1
  shift
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# wait_exit PID SECONDS: the exit code of a background job, killing it (and returning 124) past SECONDS.
wait_exit() {
  local pid=$1 limit=$2
  if ! wait_for "$limit" bash -c "! kill -0 $pid 2> /dev/null"; then
    kill -KILL "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    return 124
  fi
  wait "$pid"
}

# bad_setting MESSAGE SETTING...: a training with these --set items ends with exit 2 and one error line that says
# MESSAGE, before run.dir ("bad") is created.
bad_setting() {
    local want=$1
    shift
    local args=()
    for s in "$@"; do args+=(--set "$s"); done
    "$BIN" train "${COMMON[@]}" --set run.dir=bad "${args[@]}" > bad.out 2> bad.err
    local rc=$?
    [[ $rc -eq 2 ]] || fail "$*: exit $rc, expected 2: $(cat bad.err)"
    [[ $(grep -c '^moetrain: error:' bad.err) -eq 1 ]] || fail "$*: expected one error line: $(cat bad.err)"
    grep -qF -- "$want" bad.err || fail "$*: the message does not say '$want': $(cat bad.err)"
    [[ -e bad ]] && fail "$*: run.dir was created"
}

# The number of "step N/" progress lines in a file.
progress_lines() { grep -c '^step .*| loss' "$1" 2> /dev/null || true; }

for i in $(seq 1 300); do printf 'Fortune number %d: the experts route every token to a place.\n%%\n' "$i"; done > corpus.txt
"$BIN" data --input corpus.txt --out data > /dev/null || { echo "FAIL: data preparation"; exit 1; }
cp "$SRC/configs/tiny.toml" job.toml
# One thread and tiny batches: the trainings these scripts start stay cheap beside CI's other jobs.
COMMON=(--config job.toml --set 'data.paths=["data/train.bin"]' --set 'data.val_paths=["data/val.bin"]'
        --set train.batch_size=2 --set train.seq_len=32 --set train.eval_every=0 --set run.threads=1
        --set run.device=cpu)
