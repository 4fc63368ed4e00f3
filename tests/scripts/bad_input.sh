#!/usr/bin/env bash
# Every bad input of the Foundation issue through the real CLI: one clear message naming the file, field or
# tensor on stderr, the documented non-zero exit code, no crash, nothing half-written.
# Usage: bad_input.sh <moetrain> <source-dir> <scratch-dir>
set -uo pipefail
# Absolute paths: the script works inside the scratch directory.
BIN=$(realpath -- "$1")
SRC=$(realpath -- "$2")
SCRATCH=$3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
cd "$SCRATCH"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect CODE NEEDLE -- command...: runs it (at most 60 s: a hang fails as exit 124; the shell functions below
# bound themselves), checks the exit code, one error line, and the needle in stderr.
expect() {
  local code=$1 needle=$2
  shift 3
  if [[ $(type -t "$1") == function ]]; then "$@"; else timeout 60 "$@"; fi > out.txt 2> err.txt
  local rc=$?
  local what="$*"
  [[ $rc -eq $code ]] || fail "exit $rc, expected $code: $what :: $(cat err.txt)"
  [[ $(grep -c '^moetrain: error:' err.txt) -eq 1 ]] || fail "expected one error line: $what :: $(cat err.txt)"
  grep -qF -- "$needle" err.txt || fail "message lacks '$needle': $what :: $(cat err.txt)"
  echo "ok ($rc): $(head -1 err.txt)"
}

for i in $(seq 1 300); do printf 'Fortune number %d: the experts route every token to a place.\n%%\n' "$i"; done > corpus.txt
"$BIN" data --input corpus.txt --out data > /dev/null || { echo "FAIL: data preparation"; exit 1; }
cp "$SRC/configs/tiny.toml" job.toml
COMMON=(--set run.dir=run --set 'data.paths=["data/train.bin"]' --set 'data.val_paths=["data/val.bin"]'
        --set train.steps=2 --set train.batch_size=2 --set train.seq_len=32 --set train.eval_every=0
        --set checkpoint.every_steps=2)
train() { timeout 60 "$BIN" train --config job.toml "${COMMON[@]}" "$@"; }

printf '[model]\nd_model = = 3\n' > malformed.toml
expect 2 "malformed.toml" -- "$BIN" train --config malformed.toml
expect 2 "train.stpes" -- train --set train.stpes=3
grep -qF "did you mean \`train.steps\`" err.txt || fail "no suggestion for the typo"
expect 2 "train.steps must be an integer" -- train --set 'train.steps="ten"'
expect 2 "train.lr = -1 is out of range" -- train --set train.lr=-1
expect 2 "missing.toml" -- "$BIN" train --config missing.toml
expect 3 "nope.bin" -- train --set 'data.paths=["nope.bin"]'

head -c 2000 data/train.bin > truncated.bin
expect 3 "truncated.bin" -- train --set 'data.paths=["truncated.bin"]'
cp data/train.bin badmagic.bin
printf 'XXXX' | dd of=badmagic.bin bs=1 count=4 conv=notrunc 2> /dev/null
expect 3 "badmagic.bin" -- train --set 'data.paths=["badmagic.bin"]'
# Bytes of the text are >= 100, so a 100-token vocabulary cannot hold them.
expect 3 "train.bin" -- train --set model.vocab_size=100

# A good checkpoint, then damaged copies of it.
train > /dev/null 2>&1 || fail "training the reference checkpoint failed"
CK=run/checkpoints/step_00000002
[[ -f $CK/DONE ]] || fail "no checkpoint written"
expect 4 "layers.0.mlp.w_down.weight" -- train --resume --set model.d_ff=512 --set train.steps=4
cp -r run run_corrupt
truncate -s 1000 run_corrupt/checkpoints/step_00000002/rank_00000.safetensors
expect 4 "rank_00000.safetensors" -- train --resume --set run.dir=run_corrupt --set train.steps=4
cp -r run run_badjson
echo '{"format": ' > run_badjson/checkpoints/step_00000002/manifest.json
expect 4 "manifest.json" -- train --resume --set run.dir=run_badjson --set train.steps=4
expect 4 "rank_00000.safetensors" -- "$BIN" inspect run_corrupt/checkpoints/step_00000002

# run.device = "cuda" where no GPU is visible: exit 5 naming the key. An empty CUDA_VISIBLE_DEVICES hides any GPU
# there is, so the case holds for a CUDA build on a GPU machine as well as for this CPU one.
expect 5 'run.device = "cuda" but no CUDA device is available' -- \
  env CUDA_VISIBLE_DEVICES= "$BIN" train --config job.toml "${COMMON[@]}" --set run.device=cuda
expect 5 'run.device = "cuda" but no CUDA device is available' -- \
  env CUDA_VISIBLE_DEVICES= "$BIN" train --config job.toml "${COMMON[@]}" --device cuda

# inject FILE KEY BYTES: overwrites the first element of the F32 tensor KEY of a safetensors file with 4 bytes
# (conventions §5.1: a u64 LE header length N, the JSON header, then the buffer that data_offsets count from).
inject() {
  local file=$1 key=$2 bytes=$3 n entry begin
  n=$(od -An -tu8 -N8 "$file" | tr -d ' ')
  entry=$(head -c $((8 + n)) "$file" | tail -c "$n" | grep -ao "\"$key\":{[^}]*}")
  [[ $entry == *'"F32"'* ]] || return 1
  begin=$(sed -E 's/.*"data_offsets":\[([0-9]+),.*/\1/' <<< "$entry")
  printf "$bytes" | dd of="$file" bs=1 seek=$((8 + n + begin)) conv=notrunc 2> /dev/null
}
NAN='\x00\x00\xc0\x7f'      # a quiet NaN
FLT_MAX='\xff\xff\x7f\x7f'  # 3.4e38: finite, but it overflows the logits to inf

# Two checkpoints (steps 1 and 2) to damage.
train --set run.dir=run2 --set checkpoint.every_steps=1 > /dev/null 2>&1 || fail "training run2 failed"
W=param/final_norm.weight
F2=checkpoints/step_00000002/rank_00000.safetensors

# The final norm's gain at FLT_MAX makes the logits overflow and the loss NaN: the resumed run stops at its first
# step (3) with exit 7, before the checkpoint due after that step. Resuming from step 2, whose weights lead here
# again, would repeat it: the hint names the checkpoint before it. The CRC of the edited file is stale on purpose.
cp -r run2 run_nan
inject run_nan/$F2 $W "$FLT_MAX" || fail "could not find $W to edit"
expect 7 "non-finite loss" -- train --resume --set run.dir=run_nan --set train.steps=4 \
  --set checkpoint.every_steps=1 --set checkpoint.verify_on_resume=false
grep -qF "at step 3" err.txt || fail "the non-finite loss message does not name step 3: $(cat err.txt)"
grep -qF "resume with --resume-from run_nan/checkpoints/step_00000001" err.txt ||
  fail "the hint does not point before the checkpoint that leads to the NaN: $(cat err.txt)"
[[ $(ls run_nan/checkpoints | tr '\n' ' ') == "step_00000001 step_00000002 " ]] ||
  fail "checkpoints after the NaN step: $(ls run_nan/checkpoints)"

# A NaN stored in a weight is found when it is loaded, even without the CRC check: exit 4 naming the tensor.
cp -r run2 run_nanw
inject run_nanw/$F2 $W "$NAN"
expect 4 "tensor final_norm.weight (param) holds a non-finite value" -- train --set run.dir=run_nanw \
  --set train.steps=4 --set checkpoint.verify_on_resume=false --resume-from run_nanw/checkpoints/step_00000002

# One flipped bit in a weight of the newest checkpoint: the CRC check, on by default, finds it. --resume falls back
# to the previous complete checkpoint with a warning; --resume-from that checkpoint fails with exit 4.
cp -r run2 run_flip
n=$(od -An -tu8 -N8 run_flip/$F2 | tr -d ' ')
byte=$(od -An -tu1 -j $((8 + n + 64)) -N1 run_flip/$F2 | tr -d ' ')
printf "\\x$(printf %02x $((byte ^ 64)))" | dd of=run_flip/$F2 bs=1 seek=$((8 + n + 64)) conv=notrunc 2> /dev/null
expect 4 "CRC-32C" -- train --set run.dir=run_flip --set train.steps=4 --resume-from run_flip/checkpoints/step_00000002
grep -qF "rank_00000.safetensors" err.txt || fail "the CRC message does not name the file: $(cat err.txt)"
timeout 60 "$BIN" train --config job.toml "${COMMON[@]}" --set run.dir=run_flip --set train.steps=3 --resume \
  > out.txt 2> err.txt || fail "--resume past a damaged checkpoint: exit $?: $(cat err.txt)"
grep -qF "skipping the damaged checkpoint run_flip/checkpoints/step_00000002" out.txt ||
  fail "no warning about the damaged checkpoint: $(head -3 out.txt)"
grep -qF "resumed from run_flip/checkpoints/step_00000001 at step 1" out.txt || fail "no fallback: $(head -3 out.txt)"
echo "ok (0): $(grep -F skipping out.txt | cut -c1-140)"

# Nothing half-written anywhere: no temporary files, every checkpoint directory complete.
leftovers=$(find . -name '*.tmp' | head -5)
[[ -z $leftovers ]] || fail "temporary files left behind: $leftovers"
for d in run*/checkpoints/step_*; do [[ -f $d/DONE ]] || fail "incomplete checkpoint $d"; done

[[ $failures -eq 0 ]] || { echo "bad_input: $failures failures"; exit 1; }
echo "bad_input: ok"
