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
expect 2 'kda.save = "all" is not one of: none, states_bf16, tiles, states, workspace' -- train --set kda.save=all
expect 2 'config key `kda.save_tiles` was removed: write kda.save = "tiles" instead' -- train --set kda.save_tiles=true
expect 2 'config key `model.residual` was removed: write attnres.mode' -- train --set model.residual=block_attnres
expect 2 "missing.toml" -- "$BIN" train --config missing.toml
expect 3 "nope.bin" -- train --set 'data.paths=["nope.bin"]'

head -c 2000 data/train.bin > truncated.bin
expect 3 "truncated.bin" -- train --set 'data.paths=["truncated.bin"]'
cp data/train.bin badmagic.bin
printf 'XXXX' | dd of=badmagic.bin bs=1 count=4 conv=notrunc 2> /dev/null
expect 3 "badmagic.bin" -- train --set 'data.paths=["badmagic.bin"]'
# Bytes of the text are >= 100, so a 100-token vocabulary cannot hold them (document masking off: with it the EOT,
# 256, is refused first, as the config check below shows).
expect 3 "train.bin" -- train --set model.vocab_size=100 --set data.document_mask=false
expect 2 "data.eot_token = 256" -- train --set model.vocab_size=100 --set data.document_mask=true

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

# run.dir that cannot be a run directory: exit 2 naming run.dir (not exit 1).
touch afile
expect 2 'run.dir = "afile" exists but is not a directory' -- train --set run.dir=afile
expect 2 'run.dir = "afile/sub" cannot be created' -- train --set run.dir=afile/sub
expect 2 "run.dir is empty" -- train --set 'run.dir=""'

# A config path that is not a regular file: a directory (once read as an empty config) and a FIFO (once a hang).
expect 2 "not a regular file (a directory)" -- "$BIN" train --config .
mkfifo fifo.toml
expect 2 "not a regular file (a special file) [fifo.toml]" -- "$BIN" train --config fifo.toml

# FIFOs where files belong fail at once (opening one for reading used to block forever): a shard (exit 3), a
# checkpoint manifest (exit 4), and inspect.
mkfifo fifo.bin
expect 3 "not a regular file (a FIFO) [fifo.bin]" -- train --set 'data.paths=["fifo.bin"]'
cp -r run run_fifo
rm run_fifo/checkpoints/step_00000002/manifest.json && mkfifo run_fifo/checkpoints/step_00000002/manifest.json
expect 4 "not a regular file (a FIFO) [run_fifo/checkpoints/step_00000002/manifest.json]" -- \
  train --set run.dir=run_fifo --set train.steps=4 --resume-from run_fifo/checkpoints/step_00000002
expect 4 "not a regular file (a FIFO) [fifo.bin]" -- "$BIN" inspect fifo.bin
expect 4 "manifest.json" -- "$BIN" inspect run_fifo/checkpoints/step_00000002
rm -rf run_fifo

# Validation tokens are checked when the run starts, not at the first evaluation: a token outside the vocabulary
# in the validation shard stops the run before step 1.
cp data/val.bin badval.bin
printf '\xff\xff' | dd of=badval.bin bs=1 seek=$((1024 + 2 * 5)) conv=notrunc 2> /dev/null
expect 3 "token id 65535 >= vocab size 257 (or negative) at token 5 [badval.bin]" -- \
  train --set run.dir=run_badval --set 'data.val_paths=["badval.bin"]' --set train.eval_every=2
grep -q '^step' out.txt && fail "the run trained before finding the bad validation token: $(head -2 out.txt)"
# A validation stream shorter than one sample names its file: a valid shard of 10 tokens.
le32() { printf '\\x%02x' $(($1 & 255)) $((($1 >> 8) & 255)) $((($1 >> 16) & 255)) $((($1 >> 24) & 255)); }
{ printf "$(le32 20240520)$(le32 1)$(le32 10)"; head -c $((1024 - 12 + 20)) /dev/zero; } > shortval.bin
expect 3 "[shortval.bin]" -- train --set run.dir=run_shortval --set 'data.val_paths=["shortval.bin"]'
# The step's checkpoint is written before its evaluation.
train --set run.dir=run_order --set train.eval_every=2 > order.txt 2>&1 || fail "run_order: $(cat order.txt)"
[[ $(grep -E '^step +2/2 \| (checkpoint|val loss)' order.txt | head -1) == *checkpoint* ]] ||
  fail "the evaluation of step 2 came before its checkpoint: $(cat order.txt)"

# Resume with config drift: a warning naming each key that breaks exact resume; a train.steps below the
# checkpoint's step is exit 2, not a silent no-op. metrics.jsonl marks the resume with an event line.
cp -r run run_drift
timeout 60 "$BIN" train --config job.toml "${COMMON[@]}" --set run.dir=run_drift --set train.steps=3 --resume \
  --set run.seed=7 --set train.seq_len=16 --set 'data.paths=["data/train.bin", "data/train.bin"]' > out.txt 2> err.txt ||
  fail "resume with drift: $(cat err.txt)"
grep -qF "differs from the checkpoint's in 3 key(s), so this is no longer an exact resume" out.txt ||
  fail "no drift warning: $(head -5 out.txt)"
for key in "data.paths:" "run.seed: 1234 in the checkpoint, 7 now" "train.seq_len: 32 in the checkpoint, 16 now"; do
  grep -qF "  $key" out.txt || fail "the drift warning does not list $key: $(head -5 out.txt)"
done
grep -qE '"checkpoint":"run_drift/checkpoints/step_00000002","event":"resumed","kind":"event","load_check_seconds":[0-9.e+-]+,"load_crc_seconds":[0-9.e+-]+,"load_seconds":[0-9.e+-]+,"step":2' \
  run_drift/metrics.jsonl || fail "no resumed event in metrics.jsonl"
expect 2 "train.steps = 1 is below step 2 of the checkpoint" -- train --set run.dir=run_drift --set train.steps=1 \
  --resume-from run/checkpoints/step_00000002

# Messages.
printf 'model = "big"\n' > table.toml
expect 2 "config value \`model\` must be a table, got string" -- "$BIN" train --config table.toml
expect 2 "is not valid TOML" -- train --set train.steps=1234567890123456789012345678901
grep -q "got string" err.txt && fail "an over-long integer is reported as a string: $(cat err.txt)"
expect 2 "train.steps = 9223372036854775807 is out of range: must be >= 0 and <= 1000000000000" -- \
  train --set train.steps=9223372036854775807
expect 4 "not a checkpoint directory: the path is a file" -- train --resume-from $CK/manifest.json
expect 2 "--config is required" -- "$BIN" train
expect 2 "--resume excludes --resume-from" -- train --resume --resume-from $CK
"$BIN" inspect $CK --verify > out.txt 2>&1 || fail "inspect --verify: $(tail -3 out.txt)"
grep -qF "verified: 1 file(s)" out.txt || fail "inspect --verify does not say what it verified: $(tail -2 out.txt)"
echo "ok (0): $(grep '^verified' out.txt)"

# Image-text data on disk (docs/data.md "Image-text data"): a corrupt image, a missing caption, a truncated shard, a
# missing manifest image and a malformed manifest line each end with exit 3 naming the shard (or manifest line) and the
# sample key; with data.skip_bad_samples = true the sample is skipped with a counted warning instead.
"$BIN" data --images --count 8 --per-shard 8 --stage 1 --out img --manifest > /dev/null || fail "data --images"
IMG=(--config "$SRC/configs/shapes_tiny.toml" --set run.dir=run_img --set 'data.format="webdataset"'
     --set 'data.paths=["img/train-000000.tar"]' --set data.eot_token=-1 --set model.vocab_size=262
     --set vision.image_token=-1 --set vision.min_pixels=3136 --set vision.max_pixels=12544 --set train.seq_len=96
     --set train.batch_size=2 --set train.steps=1 --set train.eval_every=0 --set checkpoint.every_steps=0
     --set vision.layers=1 --set vision.dim=32 --set vision.heads=2 --set vision.mlp=64)
imgtrain() { timeout 60 "$BIN" train "${IMG[@]}" "$@"; }
imgtrain > out.txt 2>&1 || fail "training on the written shard: $(tail -3 out.txt)"
mkdir -p samples && cp img/train/00000000.png samples/a.png && echo "a caption" > samples/a.txt
printf 'not an image at all' > samples/b.png && echo "b caption" > samples/b.txt
tar -cf corrupt.tar -C samples a.png a.txt b.png b.txt
expect 3 '[corrupt.tar, sample "b"]' -- imgtrain --set 'data.paths=["corrupt.tar"]'
grep -qF "corrupt image b.png: not a PNG or JPEG image" err.txt || fail "no reason for the corrupt image: $(cat err.txt)"
cp samples/a.png samples/c.png
tar -cf nocaption.tar -C samples a.png a.txt c.png
expect 3 'missing caption: the sample has no .txt or .json member [nocaption.tar, sample "c"]' -- \
  imgtrain --set 'data.paths=["nocaption.tar"]'
# Cut inside the second sample's image (tar -R gives each member's first block).
block=$(tar -tR -f img/train-000000.tar | sed -n 's/^block \([0-9]*\): 00000001.png$/\1/p')
head -c $((block * 512 + 512 + 100)) img/train-000000.tar > cut.tar
expect 3 '[cut.tar, sample "00000001"]' -- imgtrain --set 'data.paths=["cut.tar"]'
grep -qF "truncated" err.txt || fail "the cut shard is not called truncated: $(cat err.txt)"
{ head -1 img/train.jsonl; echo '{"image": "train/missing.png", "text": "gone"}'; } > img/missing.jsonl
expect 3 'line 2, image "train/missing.png"]' -- \
  imgtrain --set 'data.format="image_jsonl"' --set 'data.paths=["img/missing.jsonl"]'
{ head -1 img/train.jsonl; echo '{"image": "train/00000001.png", "text": '; } > img/malformed.jsonl
expect 3 'malformed manifest line: not a JSON object [img/malformed.jsonl line 2]' -- \
  imgtrain --set 'data.format="image_jsonl"' --set 'data.paths=["img/malformed.jsonl"]'
# A sound header over damaged pixel data: found when the batch is made, at step 1, naming the sample.
cp samples/a.png samples/d.png && echo "d caption" > samples/d.txt
size=$(stat -c %s samples/d.png)
printf '\x55' | dd of=samples/d.png bs=1 seek=$((size - 40)) conv=notrunc 2> /dev/null
tar -cf badpixels.tar -C samples d.png d.txt
expect 3 'corrupt PNG' -- imgtrain --set 'data.paths=["badpixels.tar"]'
grep -qF '[badpixels.tar, sample "d"]' err.txt || fail "the damaged pixels do not name the sample: $(cat err.txt)"
# Skipping: every bad sample above is left out with a counted warning and the run trains on the good ones (4 samples
# in 4 rows: two steps of two rows read them all).
imgtrain --set data.skip_bad_samples=true --set train.steps=2 \
  --set 'data.paths=["corrupt.tar", "nocaption.tar", "cut.tar", "badpixels.tar"]' \
  > out.txt 2> err.txt || fail "skip_bad_samples: exit $?: $(cat err.txt)"
for needle in 'skipped bad sample (1 so far): corrupt image b.png' 'skipped bad sample (2 so far): missing caption' \
  'skipped bad sample (3 so far): truncated' '3 bad samples skipped' 'skipped bad sample (4 so far): corrupt PNG'; do
  grep -qF "$needle" out.txt || fail "no warning '$needle': $(grep -i bad out.txt)"
done
echo "ok (0): $(grep -c 'skipped bad sample' out.txt) bad samples skipped with warnings"

# Mixed sources ([[data.sources]], docs/data.md "Mixed sources"): each bad entry exits 2 naming the field.
mix() { { cat job.toml; printf '%s\n' "$@"; } > mix.toml; timeout 60 "$BIN" train --config mix.toml "${COMMON[@]}"; }
TEXT=('format = "llmc"' 'paths = ["data/train.bin"]')
expect 2 'data.format = "csv"' -- mix '[[data.sources]]' 'name = "a"' 'format = "csv"' 'paths = ["data/train.bin"]'
expect 2 'data.sources[0].weight = 0 is out of range' -- mix '[[data.sources]]' 'name = "a"' 'weight = 0' "${TEXT[@]}"
expect 2 'data.sources[1].name = "a" is a duplicate' -- \
  mix '[[data.sources]]' 'name = "a"' "${TEXT[@]}" '[[data.sources]]' 'name = "a"' "${TEXT[@]}"
expect 2 'data.sources[1].tokenizer = "gpt2" differs' -- \
  mix '[[data.sources]]' 'name = "a"' "${TEXT[@]}" '[[data.sources]]' 'name = "b"' "${TEXT[@]}" 'tokenizer = "gpt2"'
expect 2 'loss.weighting = "dwa" weights the sources of data.sources' -- train --set loss.weighting=dwa

# Nothing half-written anywhere: no temporary files, every checkpoint directory complete.
leftovers=$(find . -name '*.tmp' | head -5)
[[ -z $leftovers ]] || fail "temporary files left behind: $leftovers"
for d in run*/checkpoints/step_*; do [[ -f $d/DONE ]] || fail "incomplete checkpoint $d"; done

[[ $failures -eq 0 ]] || { echo "bad_input: $failures failures"; exit 1; }
echo "bad_input: ok"
