#!/usr/bin/env bash
# docs/configs.md is generated from the config schema (src/train/config_schema.cpp), docs/metrics.md from the metric
# registry (src/train/metric_registry.cpp, for configs/kimi_linear_mini.toml, at least 200 metrics): this fails while a
# committed page differs from what `moetrain config --docs` / `--metrics` prints, and shows the difference. Also: `moetrain config` without
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
# docs/metrics.md likewise from the metric registry, for configs/kimi_linear_mini.toml.
"$BIN" config --metrics --config "$SRC/configs/kimi_linear_mini.toml" > "$SCRATCH/metrics.md" ||
    { echo "FAIL: moetrain config --metrics exited $?"; exit 1; }
sed -i "s|$SRC/||" "$SCRATCH/metrics.md"
if ! diff -u "$SRC/docs/metrics.md" "$SCRATCH/metrics.md"; then
    echo "FAIL: docs/metrics.md is out of date with the metric registry; regenerate it:"
    echo "    build/moetrain config --metrics --config configs/kimi_linear_mini.toml > docs/metrics.md"
    exit 1
fi
n=$(grep -o '^\*\*[0-9]* metrics\*\*' "$SCRATCH/metrics.md" | tr -dc 0-9)
[[ $n -ge 200 ]] || { echo "FAIL: kimi_linear_mini's registry has $n metrics, fewer than 200"; exit 1; }
"$BIN" config > /dev/null 2> "$SCRATCH/err.txt"
rc=$?
[[ $rc -eq 2 ]] || { echo "FAIL: moetrain config without --docs exited $rc, expected 2"; exit 1; }
grep -qF -- "--docs" "$SCRATCH/err.txt" || { echo "FAIL: the usage error does not name --docs: $(cat "$SCRATCH/err.txt")"; exit 1; }
echo "config_docs: docs/configs.md is current ($(wc -l < "$SCRATCH/configs.md") lines), docs/metrics.md too ($n metrics)"
