#!/usr/bin/env bash
# TensorBoard's own reader on moetrain's event files (docs/operations.md "TensorBoard"; conventions §7.3): a tiny
# CPU training with metrics.tensorboard = true, then tensorboard's EventAccumulator reads <run.dir>/tb/ and every
# scalar of every train line in metrics.jsonl must be there, under its path (train/<key>, or the key when it has a
# slash), at its step, with its value (as f32, which is what an event's simple_value holds; a bool as 1 or 0). The golden bytes of the format are a unit test on every machine
# (TensorBoardWriter.*); this reader needs the tensorboard Python package, which the device image has and Debian
# does not: the script is named gpu_* so that the device suite (`ctest -L gpu`) runs it, and exits 77 (CTest:
# skipped) where `import tensorboard` fails. Where prometheus_client is installed, its parser reads metrics.prom.
# Usage (CTest): bash gpu_tensorboard_readback.sh <moetrain-binary> <source-dir> <scratch-dir>
PY=${MT_TENSORBOARD_PYTHON:-python3}
if ! "$PY" -c 'import tensorboard' 2> /dev/null; then
    echo "gpu_tensorboard_readback: the tensorboard Python package is not installed here: skipped"
    exit 77
fi
source "$(dirname "$0")/lib/cli_common.sh" "$@"

"$BIN" train "${COMMON[@]}" --set train.steps=12 --set metrics.every=3 --set metrics.tensorboard=true \
    --set metrics.prometheus_file=true --set run.dir=tb_run > train.out 2>&1 || fail "training: exit $?: $(tail -3 train.out)"
"$PY" - tb_run <<'PY' || fail "the reader disagrees with metrics.jsonl (above)"
import glob, json, math, struct, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run = sys.argv[1]
files = glob.glob(run + "/tb/events.out.tfevents.*")
assert len(files) == 1, f"expected one event file, found {files}"
acc = EventAccumulator(run + "/tb", size_guidance={"scalars": 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
train = [l for l in lines if l["kind"] == "train"]
assert train, "no train lines in metrics.jsonl"
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
checked = missing = wrong = 0
for line in train:
    for key, value in line.items():
        if key in ("step", "time", "kind") or not isinstance(value, (bool, int, float)):
            continue
        tag = key if "/" in key else "train/" + key  # metric_path (src/train/metrics.cpp)
        if tag not in tags:
            missing += 1
            print(f"missing tag {tag}")
            continue
        events = {e.step: e.value for e in acc.Scalars(tag)}
        got = events.get(line["step"])
        want = f32(float(value))  # a bool is 1 or 0
        if got is None or not (got == want or (math.isnan(got) and math.isnan(want))):
            wrong += 1
            print(f"{key} at step {line['step']}: TensorBoard reads {got}, metrics.jsonl has {value}")
        checked += 1
print(f"tensorboard read back {checked} scalars over {len(train)} train lines ({len(tags)} tags); "
      f"{missing} missing, {wrong} wrong")
sys.exit(0 if checked > 0 and missing == 0 and wrong == 0 else 1)
PY
# Where the Python has prometheus_client, its parser reads <run.dir>/metrics.prom too (the strict 0.0.4 parser of
# PrometheusText.* checks the format on every machine).
if "$PY" -c 'import prometheus_client' 2> /dev/null; then
    "$PY" - tb_run/metrics.prom <<'PY' || fail "prometheus_client cannot read metrics.prom (above)"
import sys
from prometheus_client.parser import text_string_to_metric_families
families = list(text_string_to_metric_families(open(sys.argv[1]).read()))
samples = sum(len(f.samples) for f in families)
print(f"prometheus_client read {len(families)} families, {samples} samples")
sys.exit(0 if samples > 0 else 1)
PY
fi
finish gpu_tensorboard_readback
