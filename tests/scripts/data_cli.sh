#!/usr/bin/env bash
# `moetrain data` end to end: tokenize a generated fortune corpus (llmc and megatron), train a tokenizer, and
# check the exit codes and messages of bad inputs. Usage: data_cli.sh <moetrain> <source-dir> <scratch-dir>
set -euo pipefail
BIN=$1
SCRATCH=$3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH/in"
cd "$SCRATCH"

fail() { echo "FAIL: $*" >&2; exit 1; }

for f in alpha beta; do
  for i in $(seq 1 200); do printf '%s fortune %d: experts route tokens.\n%%\n' "$f" "$i"; done > "in/$f"
  echo "index" > "in/$f.dat"
done

"$BIN" data --input in --out out > log.txt
grep -q "400 docs" log.txt || fail "summary: $(cat log.txt)"
grep -q "unigram entropy" log.txt || fail "summary lacks entropy"
for f in out/train.bin out/val.bin out/stats.json; do [[ -s $f ]] || fail "missing $f"; done
grep -q '"unigram_entropy_bits"' out/stats.json || fail "stats.json lacks entropy"
[[ ! -e out/train.bin.tmp ]] || fail "temporary file left behind"
# llm.c header: magic 20240520 = 0x0134d1e8 little-endian.
[[ $(od -An -tu4 -N4 out/train.bin | tr -d ' ') == 20240520 ]] || fail "bad magic in train.bin"

"$BIN" data --input in --out meg --format megatron > /dev/null
for f in meg/train.bin meg/train.idx meg/val.bin meg/val.idx; do [[ -s $f ]] || fail "missing $f"; done
[[ $(head -c 7 meg/train.idx) == MMIDIDX ]] || fail "bad idx magic"

"$BIN" data --input in --out spm --train-tokenizer --vocab-size 320 --tokenize > log.txt
[[ -s spm/spm.model && -s spm/train.bin ]] || fail "tokenizer training: $(cat log.txt)"
"$BIN" data --input in --out spm2 --tokenizer spm/spm.model > /dev/null

set +e
"$BIN" data --input does_not_exist --out x 2> err.txt
rc=$?
set -e
[[ $rc == 3 ]] || fail "missing input: exit $rc, expected 3"
grep -q "moetrain: error: .*does_not_exist" err.txt || fail "message: $(cat err.txt)"

set +e
"$BIN" data --input in --out x --tokenizer missing.model 2> err.txt
rc=$?
set -e
[[ $rc == 3 ]] || fail "missing model: exit $rc, expected 3"
grep -q "missing.model" err.txt || fail "message: $(cat err.txt)"

set +e
"$BIN" data --input in --out x --format parquet 2> /dev/null
rc=$?
set -e
[[ $rc == 2 ]] || fail "bad format: exit $rc, expected 2"
echo "data_cli: ok"
