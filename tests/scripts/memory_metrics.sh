#!/usr/bin/env bash
# Per-step memory metrics of a short `moetrain train` of configs/tiny.toml on the CPU: every train line of
# metrics.jsonl has mem/allocated, mem/reserved, mem/peak and mem/peak_activations with sane values, the progress
# line shows the peak in GB, metrics.memory_warning set below the process's share of the machine writes one
# memory_warning event and a warning line, and a bad metrics.memory_warning is exit 2 naming the key.
# Usage: memory_metrics.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

"$BIN" train "${COMMON[@]}" --set run.dir=run --set train.steps=4 > log.txt 2>&1 || fail "training exited $?: $(cat log.txt)"
[[ $(grep -cE '^step +[0-9]+/4 \| loss .* \| peak [0-9]+\.[0-9] GB \| ETA' log.txt) -eq 4 ]] ||
  fail "progress lines lack 'peak N.N GB': $(cat log.txt)"
/usr/bin/python3 - run/metrics.jsonl << 'EOF' || fail "metrics.jsonl memory keys"
import json, sys
train = [l for l in map(json.loads, open(sys.argv[1])) if l["kind"] == "train"]
assert len(train) == 4, f"{len(train)} train lines"
for l in train:
    a, r, p, act = (l[k] for k in ("mem/allocated", "mem/reserved", "mem/peak", "mem/peak_activations"))
    assert all(isinstance(v, int) for v in (a, r, p, act)), l
    assert p >= a > 0, f"step {l['step']}: peak {p} allocated {a}"
    assert abs(r - a) <= 4 << 20, f"step {l['step']}: the CPU reports its RSS as both: reserved {r} allocated {a}"
    assert 0 <= act < p, f"step {l['step']}: peak_activations {act} peak {p}"
    assert p < 1 << 40, f"step {l['step']}: peak {p} bytes is not a tiny model's"
EOF
grep -q '"event":"memory_warning"' run/metrics.jsonl && fail "a memory_warning event at the default 0.95"

"$BIN" train "${COMMON[@]}" --set run.dir=warn --set train.steps=3 --set metrics.memory_warning=1e-9 > log.txt 2>&1 ||
  fail "training with a low memory_warning exited $?"
[[ $(grep -c '"event":"memory_warning"' warn/metrics.jsonl) -eq 1 ]] ||
  fail "expected one memory_warning event (the fraction stays above): $(grep memory_warning warn/metrics.jsonl)"
grep -qE '^step +1/3 \| warning: process memory reserved .*above metrics.memory_warning = 1e-09' log.txt ||
  fail "no warning line at step 1: $(cat log.txt)"

"$BIN" train "${COMMON[@]}" --set run.dir=bad --set metrics.memory_warning=0 > log.txt 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "metrics.memory_warning = 0 exited $rc, expected 2"
grep -q "metrics.memory_warning" log.txt || fail "the error does not name the key: $(cat log.txt)"
finish memory_metrics
