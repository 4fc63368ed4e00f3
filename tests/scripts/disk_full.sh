#!/usr/bin/env bash
# metrics.jsonl on a full disk (docs/training.md, "Exit codes"): a failed write ends the run with exit 9 naming the
# file and leaves no torn line, and a torn last line left by a run that died while writing is cut off when the log
# is opened again, so every line stays one JSON object. The full disk is /dev/full and, where this machine lets
# the script mount one (root, or an unprivileged user namespace), a small tmpfs; otherwise that case is skipped
# with the reason printed.
# Usage: disk_full.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

# every_line_json FILE: each line of FILE parses as one JSON object and the file ends with a newline.
every_line_json() {
  [[ ! -s $1 || $(tail -c 1 "$1" | od -An -c | tr -d ' ') == '\n' ]] || return 1
  while IFS= read -r line; do
    [[ $line == \{*\} ]] || return 1
  done < "$1"
}

tmpfs_case() {
  local mnt=$1 rc
  mkdir -p "$mnt/R"
  head -c 100 /dev/zero | tr '\0' x > "$mnt/R/.lock"  # the lock file's page, allocated before the disk fills
  dd if=/dev/zero of="$mnt/filler" bs=4096 2> /dev/null
  truncate -s -4096 "$mnt/filler"  # one page left: the config line fits, a few train lines after it do not
  timeout 120 "$BIN" train "${COMMON[@]}" --set run.dir="$mnt/R" --set train.steps=100000 --set checkpoint.every_steps=0 \
    > tmpfs.out 2> tmpfs.err
  rc=$?
  [[ $rc -eq 9 ]] || fail "tmpfs full: exit $rc, expected 9: $(tail -3 tmpfs.err)"
  grep -qF "cannot write the metrics log: No space left on device [$mnt/R/metrics.jsonl]" tmpfs.err ||
    fail "tmpfs full: message: $(cat tmpfs.err)"
  every_line_json "$mnt/R/metrics.jsonl" || fail "tmpfs full: metrics.jsonl ends in a torn line: $(tail -c 120 "$mnt/R/metrics.jsonl")"
  # Space again: the next run's lines start on lines of their own.
  rm -f "$mnt/filler"
  timeout 120 "$BIN" train "${COMMON[@]}" --set run.dir="$mnt/R" --set train.steps=2 --set checkpoint.every_steps=0 \
    > tmpfs2.out 2>&1 || fail "tmpfs, after freeing space: $(tail -3 tmpfs2.out)"
  every_line_json "$mnt/R/metrics.jsonl" || fail "tmpfs: metrics.jsonl has a glued line after the second run"
  echo "ok (9): tmpfs: $(head -1 tmpfs.err)"
}

if [[ ${MT_DISK_FULL_TMPFS_ONLY:-} == 1 ]]; then
  # Re-run inside an unprivileged user and mount namespace (below): the tmpfs case only.
  mkdir -p mnt && mount -t tmpfs -o size=1m tmpfs mnt || { echo "SKIP: cannot mount a tmpfs in the namespace"; exit 0; }
  tmpfs_case "$PWD/mnt"
  umount mnt
  finish disk_full_tmpfs
fi

# /dev/full: every write fails with ENOSPC.
mkdir -p R_full && ln -s /dev/full R_full/metrics.jsonl
timeout 60 "$BIN" train "${COMMON[@]}" --set run.dir=R_full --set train.steps=2 > full.out 2> full.err
rc=$?
[[ $rc -eq 9 ]] || fail "/dev/full: exit $rc, expected 9: $(cat full.err)"
[[ $(grep -c '^moetrain: error:' full.err) -eq 1 ]] || fail "/dev/full: expected one error line: $(cat full.err)"
grep -qF "cannot write the metrics log: No space left on device [R_full/metrics.jsonl]" full.err ||
  fail "/dev/full: message: $(cat full.err)"
echo "ok ($rc): $(head -1 full.err)"

# A torn last line (a run killed while writing it) is cut when the next run opens the log.
mkdir -p R_torn && printf '{"step":0,"kind":"config"}\n{"step":1,"kind":"tr' > R_torn/metrics.jsonl
timeout 60 "$BIN" train "${COMMON[@]}" --set run.dir=R_torn --set train.steps=2 > torn.out 2> torn.err ||
  fail "torn tail: exit $?: $(cat torn.err)"
grep -qF "the metrics log ended in a torn line (20 bytes" torn.out || fail "torn tail: no warning: $(head -3 torn.out)"
every_line_json R_torn/metrics.jsonl || fail "torn tail: a line is not one JSON object: $(head -c 300 R_torn/metrics.jsonl)"

# A real full file system, where one can be mounted.
if mkdir -p mnt && mount -t tmpfs -o size=1m tmpfs mnt 2> /dev/null; then
  tmpfs_case "$PWD/mnt"
  umount mnt
elif command -v unshare > /dev/null && unshare -rm true 2> /dev/null; then
  MT_DISK_FULL_TMPFS_ONLY=1 unshare -rm bash "$0" "$1" "$2" "$SCRATCH/ns" || fail "tmpfs case in a user namespace"
else
  echo "SKIP: tmpfs case: this machine lets the script neither mount a tmpfs nor create a user namespace"
fi
finish disk_full
