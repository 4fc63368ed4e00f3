#!/usr/bin/env bash
# MoE balancing ablation (issue 5): the tiny MoE model (configs/tiny_moe.toml) trained with the same seed, data and
# steps under each balancing method — none, aux_loss, sign_bias, quantile with update interval 1 and 100 — at
# capacity factor 1.25 (rows above an expert's capacity are dropped, lowest gates first), then one table of final
# validation loss, MaxVio, load variance and drop rate (tools/moe/ablation_table.py).
# Usage: bash tools/moe/ablation.sh [moetrain-binary] [out-dir] [extra --set overrides...]
# Prepare the data first: moetrain data   (writes data/fortunes/{train,val}.bin)
set -euo pipefail
MOETRAIN=${1:-build/moetrain}
OUT=${2:-runs/moe_ablation}
shift $(( $# < 2 ? $# : 2 ))
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
declare -A VARIANTS=(
    [none]='--set moe.balance="none"'
    [aux_loss]='--set moe.balance="aux_loss"'
    [sign_bias]='--set moe.balance="sign_bias"'
    [quantile_i1]='--set moe.balance="quantile" --set moe.quantile.update_interval=1'
    [quantile_i100]='--set moe.balance="quantile" --set moe.quantile.update_interval=100'
)
for name in none aux_loss sign_bias quantile_i1 quantile_i100; do
    rm -rf "$OUT/$name"
    echo "== $name"
    # shellcheck disable=SC2086  # the variant's overrides are words
    "$MOETRAIN" train --config "$SRC/configs/tiny_moe.toml" --set run.dir=\""$OUT/$name"\" \
        --set checkpoint.every_steps=0 --set moe.capacity_factor=1.25 ${VARIANTS[$name]} "$@" > "$OUT/$name.log"
    grep "val loss" "$OUT/$name.log" | tail -1
done
/usr/bin/python3 "$SRC/tools/moe/ablation_table.py" "$OUT" none aux_loss sign_bias quantile_i1 quantile_i100
