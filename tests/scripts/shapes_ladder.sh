#!/usr/bin/env bash
# The debug ladder of multimodal.md §6 on configs/shapes_tiny.toml (CPU, one thread each): stages (i) one object,
# color only; (ii) + shape; (iii) + position, each trained from scratch and evaluated once at its end with the
# controls of §6 that a CPU run can hold:
#   image use        val loss < 0.1 x the exact blind bound, greedy exact match >= 95%
#   zeroed, shuffled the images replaced by zeros or by another sample's: loss >= 0.99 x bound
#   flipped          the greedy caption of a mirrored image is the mirrored scene's canonical caption for >= 95%
#   text-only twin   the same captions without their images (stage iii): loss within [0.99, 1.05] x bound
# Resolution (res336) is the GPU config's: these runs see 112-pixel canvases only. comp_val is reported, not gated.
# Usage: shapes_ladder.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

LADDER=(--config "$SRC/configs/shapes_tiny.toml" --set run.device=cpu --set run.threads=1
        --set checkpoint.every_steps=0 --set metrics.every=50)

# train NAME STEPS SETTING...: a training of STEPS steps with one eval at its end.
train() {
  local name=$1 steps=$2
  shift 2
  local args=()
  for s in "$@"; do args+=(--set "$s"); done
  "$BIN" train "${LADDER[@]}" --set run.dir="$name" --set train.steps="$steps" --set train.eval_every="$steps" \
    "${args[@]}" > "$name.log" 2>&1 || fail "$name: training exited $?: $(tail -5 "$name.log")"
}

# check NAME MODE: the last eval line of NAME's metrics against the controls (tools/shapes/check_controls.py).
check() {
  /usr/bin/python3 "$SRC/tools/shapes/check_controls.py" "$1/metrics.jsonl" "$2" --name "$1" "${@:3}" ||
    fail "$1: the controls"
}

CONTROLS='data.shapes.controls=["zeroed","shuffled","flipped"]'
train stage1 200 data.shapes.stage=1 "$CONTROLS"
check stage1 image --require zeroed shuffled flipped
train stage2 400 data.shapes.stage=2 'data.shapes.controls=["zeroed","shuffled","flipped","comp_val"]'
check stage2 image --require zeroed shuffled flipped comp_val
train stage3 600 data.shapes.stage=3 'data.shapes.controls=["zeroed","shuffled","flipped","comp_val"]'
check stage3 image --require zeroed shuffled flipped comp_val
train twin3 200 data.shapes.stage=3 data.shapes.text_only=true 'data.shapes.controls=[]'
check twin3 twin
finish shapes_ladder
