#!/usr/bin/env bash
# Asynchronous checkpoints (docs/operations.md "Asynchronous checkpoints"): a training of a model whose checkpoint
# takes a while to write is killed with SIGKILL while a checkpoint is being written in the background (its
# step_*.tmp directory holds the rank file, not yet DONE) and while training has already gone past that step: the
# previous complete checkpoint verifies (CRC-32C of every file), no directory without DONE is taken for one, and
# --resume continues from the previous checkpoint. Trials, each killed at a later checkpoint, until three kills
# landed in a background write (at most six: on a loaded machine the poll may see a write only as it completes).
# Usage: async_checkpoint.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

# About 17M parameters: a checkpoint of weights and both AdamW moments is about 200 MB.
BIG=(--set model.d_model=512 --set model.n_layers=4 --set model.n_heads=8 --set model.n_kv_heads=4
     --set model.d_ff=2048 --set checkpoint.every_steps=2 --set checkpoint.keep_last=2 --set train.steps=1000)
hits=0
for trial in 1 2 3 4 5 6; do
  ((hits < 3)) || break
  dir=A$trial
  "$BIN" train "${COMMON[@]}" "${BIG[@]}" --set run.dir=$dir > $dir.out 2> $dir.err &
  pid=$!
  # Past step 4 x trial, the first checkpoint seen being written: a .tmp directory holding the rank file (the
  # background thread is writing it or has written it) and no DONE yet.
  wait_for 240 bash -c "[[ \$(grep -c '^step' $dir.out) -ge $((4 * trial)) ]]" || fail "trial $trial: no progress: $(tail -3 $dir.err)"
  if ! wait_for 240 bash -c "ls $dir/checkpoints/step_*.tmp/rank_00000.safetensors > /dev/null 2>&1"; then
    fail "trial $trial: no background write seen: $(tail -3 $dir.err)"
    kill -KILL $pid 2> /dev/null
    continue
  fi
  kill -KILL $pid
  wait $pid 2> /dev/null
  want=$(ls -d $dir/checkpoints/step_*.tmp 2> /dev/null | head -1)
  [[ -n $want && ! -e $want/DONE ]] || { echo "trial $trial: the write completed before the kill; the check is void"; continue; }
  last=$(ls -d $dir/checkpoints/step_* 2> /dev/null | grep -v '\.tmp$' | sort | tail -1)
  [[ -n $last && -f $last/DONE ]] || { fail "trial $trial: no complete checkpoint before $want"; continue; }
  "$BIN" inspect "$last" --verify > $dir.inspect 2>&1 || fail "trial $trial: $last does not verify: $(tail -3 $dir.inspect)"
  step=$((10#${last##*step_}))
  timeout 300 "$BIN" train "${COMMON[@]}" "${BIG[@]}" --set run.dir=$dir --set train.steps=$((step + 1)) --resume \
    > $dir.2.out 2>&1 || fail "trial $trial: resume failed: $(tail -3 $dir.2.out)"
  grep -qF "resumed from $last at step $step" $dir.2.out || fail "trial $trial: did not resume from $last: $(head -3 $dir.2.out)"
  hits=$((hits + 1))
  echo "ok: trial $trial killed during the background write of $(basename $want) (last progress line: $(grep -o '^step *[0-9]*' $dir.out | tail -1 | tr -s ' ')); $last verified and resumed"
done
# A trial whose kill came after the write completed compared nothing.
[[ $hits -ge 2 ]] || fail "only $hits of $trial kills landed in a background write"
finish async_checkpoint
