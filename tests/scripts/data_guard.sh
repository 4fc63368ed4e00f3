#!/usr/bin/env bash
# A token shard changed under a running training (docs/training.md, "Data files during a run"): truncated (the map
# would raise SIGBUS) or overwritten in place with other tokens of the same size (which would be read silently).
# Either way the run writes a checkpoint of its last completed step, prints one error line naming the file and
# exits 3; the checkpoint resumes once the data is back.
# Usage: data_guard.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

# change_case NAME COMMAND...: a long run on NAME.bin (a copy of the train shard), COMMAND once it has made progress.
change_case() {
  local name=$1 pid rc step
  shift
  cp data/train.bin $name.bin
  "$BIN" train "${COMMON[@]}" --set run.dir=R_$name --set "data.paths=[\"$name.bin\"]" --set train.steps=100000 \
    > $name.out 2> $name.err &
  pid=$!
  wait_for 60 bash -c "[[ \$(grep -c '^step' $name.out 2> /dev/null) -ge 3 ]]" || fail "$name: no progress: $(cat $name.err)"
  "$@"
  wait_exit $pid 60
  rc=$?
  [[ $rc -eq 3 ]] || { fail "$name: exit $rc, expected 3: $(tail -3 $name.err)"; return; }
  [[ $(grep -c '^moetrain: error:' $name.err) -eq 1 ]] || fail "$name: expected one error line: $(cat $name.err)"
  grep -q "^moetrain: error: .*\(SIGBUS\|changed while the run was using it\).*\[$name.bin\]" $name.err ||
    fail "$name: the message does not say that $name.bin changed: $(cat $name.err)"
  step=$(grep -o "^step *[0-9]*/" $name.out | tail -1 | tr -dc 0-9)
  [[ -f R_$name/checkpoints/$(printf step_%08d "$step")/DONE ]] || fail "$name: no checkpoint of the last step $step"
  grep -qF "the run stopped after step $step with checkpoint" $name.err || fail "$name: the hint does not say: $(cat $name.err)"
  echo "ok ($rc): $(head -1 $name.err)"
}

change_case truncated truncate -s 0 truncated.bin
# Same size, other valid tokens: the payload rotated by one token (cp writes into the same inode).
make_other() {
  { head -c 1024 overwritten.bin; tail -c +1027 overwritten.bin; head -c 1026 overwritten.bin | tail -c 2; } > other.bin
  cp other.bin overwritten.bin
}
change_case overwritten make_other
# The data is back: the checkpoint resumes.
cp data/train.bin overwritten.bin
step=$(ls R_overwritten/checkpoints | tail -1)
timeout 120 "$BIN" train "${COMMON[@]}" --set run.dir=R_overwritten --set 'data.paths=["overwritten.bin"]' \
  --set train.steps=$((10#${step#step_} + 1)) --resume > resume.out 2>&1 || fail "resume: $(tail -3 resume.out)"
finish data_guard
