#!/usr/bin/env bash
# All seven controls of multimodal.md §6 on configs/shapes_gpu.toml (docs/multimodal.md "shapes_gpu"): trains the
# config, then its text-only twin, and checks image use, zeroed, shuffled, flipped,
# res112, res336 (exact >= 95% each), comp-val (reported), no dead expert for either modality, and the twin within
# [0.99, 1.05] x bound (tools/shapes/check_controls.py). Exit 1 naming each control that failed.
#   tools/shapes/gpu_controls.sh [RUN_ROOT] [--set section.key=value ...]   (from the repository root; needs build/)
# The --set items go to the image run (e.g. train.steps); the twin takes train.steps from TWIN_STEPS (default 400).
set -uo pipefail
root=${1:-runs/shapes_gpu_controls}
shift || true
bin=build/moetrain
mkdir -p "$root"
# One after the other: side by side on one GPU the two slowed each other several times over.
"$bin" train --config configs/shapes_gpu.toml --set run.dir="\"$root/image\"" "$@" > "$root/image.log" 2>&1
image_rc=$?
"$bin" train --config configs/shapes_gpu.toml --set run.dir="\"$root/twin\"" --set data.shapes.text_only=true \
  --set 'data.shapes.controls=[]' --set train.steps="${TWIN_STEPS:-400}" \
  --set train.eval_every="${TWIN_STEPS:-400}" --set checkpoint.every_steps=0 > "$root/twin.log" 2>&1
twin_rc=$?
fail=0
[[ $image_rc -eq 0 ]] || { echo "FAIL: the image run exited $image_rc: $(tail -3 "$root/image.log")"; fail=1; }
[[ $twin_rc -eq 0 ]] || { echo "FAIL: the twin exited $twin_rc: $(tail -3 "$root/twin.log")"; fail=1; }
here=$(dirname "$0")
python3 "$here/check_controls.py" "$root/image/metrics.jsonl" image --name image --experts \
  --require zeroed shuffled flipped res112 res336 comp_val || fail=1
python3 "$here/check_controls.py" "$root/twin/metrics.jsonl" twin --name twin || fail=1
[[ $fail -eq 0 ]] && echo "shapes_gpu controls: ok" || echo "shapes_gpu controls: FAILED"
exit $fail
