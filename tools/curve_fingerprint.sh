#!/usr/bin/env bash
# Fingerprint of a short training run, for "no behaviour change" checks across a refactor: trains each named config
# for N steps on one device, writes a checkpoint at the last step and prints, per config, the SHA-256 of every
# checkpoint tensor file and of the per-step loss/grad-norm columns of metrics.jsonl. Two binaries that print the
# same fingerprint trained bit-for-bit the same curve.
#   tools/curve_fingerprint.sh BINARY DEVICE STEPS CONFIG... > fingerprint.txt
# Example: tools/curve_fingerprint.sh build/moetrain cpu 20 configs/tiny.toml configs/tiny_moe.toml
# FP_SET="--set k=v ..." adds overrides to every run; FP_HASH picks the hash command (default sha256sum; md5sum is
# faster for the multi-GB checkpoints of the 1b3 configs).
set -euo pipefail
hash=${FP_HASH:-sha256sum}
read -r -a extra <<< "${FP_SET:-}"
bin=$(realpath "$1"); device=$2; steps=$3; shift 3
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
here=$(pwd)
for config in "$@"; do
    name=$(basename "$config" .toml)
    run="$work/$name"
    "$bin" train --config "$here/$config" --device "$device" --set "train.steps=$steps" \
        --set "checkpoint.every_steps=$steps" --set "train.eval_every=$steps" --set "run.dir=$run" "${extra[@]}" \
        > "$work/$name.log" 2>&1 || { echo "$name: training failed" >&2; tail -5 "$work/$name.log" >&2; exit 1; }
    ckpt=$(ls -d "$run"/checkpoints/step_* | tail -1)
    echo "== $name ($steps steps on $device)"
    (cd "$ckpt" && find . -name '*.safetensors' -o -name '*.bin' | sort | xargs $hash)
    columns=$(grep -o '"\(loss\|grad_norm\|val_loss\)":[^,}]*' "$run/metrics.jsonl" | $hash)
    echo "metrics $columns"
done
