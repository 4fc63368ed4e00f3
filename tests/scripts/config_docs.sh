#!/usr/bin/env bash
# docs/configs.md is generated from the config schema (src/train/config_schema.cpp): this fails while the committed
# page differs from what `moetrain config --docs` prints, and shows the difference. Also: `moetrain config` without
# --docs is a usage error (exit 2).
# Usage: config_docs.sh <moetrain> <source-dir> <scratch-dir>
set -uo pipefail
BIN=$(realpath -- "$1")
SRC=$(realpath -- "$2")
SCRATCH=$3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"

"$BIN" config --docs > "$SCRATCH/configs.md" || { echo "FAIL: moetrain config --docs exited $?"; exit 1; }
if ! diff -u "$SRC/docs/configs.md" "$SCRATCH/configs.md"; then
    echo "FAIL: docs/configs.md is out of date with the config schema; regenerate it:"
    echo "    build/moetrain config --docs > docs/configs.md"
    exit 1
fi
"$BIN" config > /dev/null 2> "$SCRATCH/err.txt"
rc=$?
[[ $rc -eq 2 ]] || { echo "FAIL: moetrain config without --docs exited $rc, expected 2"; exit 1; }
grep -qF -- "--docs" "$SCRATCH/err.txt" || { echo "FAIL: the usage error does not name --docs: $(cat "$SCRATCH/err.txt")"; exit 1; }
echo "config_docs: docs/configs.md is current ($(wc -l < "$SCRATCH/configs.md") lines)"
