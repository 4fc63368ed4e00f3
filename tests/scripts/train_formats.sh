#!/usr/bin/env bash
# Training end to end on every input path of `moetrain data`: llm.c shards with the byte tokenizer, a Megatron
# indexed dataset, and a SentencePiece BPE model trained on the corpus; then inspect and resume.
# Usage: train_formats.sh <moetrain> <source-dir> <scratch-dir>
set -euo pipefail
BIN=$1
SRC=$2
SCRATCH=$3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
cd "$SCRATCH"
fail() { echo "FAIL: $*" >&2; exit 1; }
for i in $(seq 1 400); do printf 'Fortune %d: a mixture of experts routes token %d to expert %d.\n%%\n' "$i" "$i" $((i % 7)); done > corpus.txt
SMALL=(--set train.steps=3 --set train.batch_size=2 --set train.seq_len=32 --set train.eval_every=3
       --set train.eval_batches=1 --set checkpoint.every_steps=3)

# llm.c shards, byte tokenizer
"$BIN" data --input corpus.txt --out bytes > /dev/null
"$BIN" train --config "$SRC/configs/tiny.toml" "${SMALL[@]}" --set run.dir=run_bytes \
  --set 'data.paths=["bytes/train.bin"]' --set 'data.val_paths=["bytes/val.bin"]' > log.txt
grep -q "val loss" log.txt || fail "no validation line: $(cat log.txt)"
[[ $(grep -c '"kind":"train"' run_bytes/metrics.jsonl) -eq 3 ]] || fail "metrics.jsonl lacks train lines"
head -1 run_bytes/metrics.jsonl | grep -q '"kind":"config"' || fail "metrics.jsonl does not start with config"

# Megatron indexed dataset
"$BIN" data --input corpus.txt --out meg --format megatron > /dev/null
"$BIN" train --config "$SRC/configs/tiny.toml" "${SMALL[@]}" --set run.dir=run_meg --set data.format=megatron \
  --set 'data.paths=["meg/train"]' --set 'data.val_paths=["meg/val"]' > log.txt
grep -q "step      3/3 | loss" log.txt || fail "megatron training: $(cat log.txt)"

# SentencePiece BPE: the model's vocabulary comes from stats.json
"$BIN" data --input corpus.txt --out spm --train-tokenizer --vocab-size 300 --tokenize > /dev/null
vocab=$(/usr/bin/python3 -c 'import json; print(json.load(open("spm/stats.json"))["vocab_size"])')
"$BIN" train --config "$SRC/configs/tiny.toml" "${SMALL[@]}" --set run.dir=run_spm --set model.vocab_size="$vocab" \
  --set 'data.paths=["spm/train.bin"]' --set 'data.val_paths=["spm/val.bin"]' --set data.tokenizer=spm/spm.model \
  > log.txt
grep -q "step      3/3 | loss" log.txt || fail "sentencepiece training: $(cat log.txt)"

# inspect lists tensors and the manifest; resume continues from the checkpoint
"$BIN" inspect run_bytes/checkpoints/step_00000003 --verify > inspect.txt
grep -q "param/layers.0.attn.wq.weight" inspect.txt || fail "inspect lacks tensors"
grep -q '"model_signature"' inspect.txt || fail "inspect lacks the manifest"
"$BIN" train --config "$SRC/configs/tiny.toml" "${SMALL[@]}" --set run.dir=run_bytes --set train.steps=5 \
  --set 'data.paths=["bytes/train.bin"]' --set 'data.val_paths=["bytes/val.bin"]' --resume > log.txt
grep -q "resumed from run_bytes/checkpoints/step_00000003 at step 3" log.txt || fail "no resume: $(cat log.txt)"
grep -q "step      5/5 | loss" log.txt || fail "resumed run did not reach step 5"
echo "train_formats: ok"
