#!/usr/bin/env bash
# Optimizer offload and bf16 optimizer state from the CLI ([optim], docs/training.md "Memory"): an offloaded run
# trains the loss curve of the on-device optimizer exactly on the CPU (the same loss on every line of metrics.jsonl)
# and says so in its log; bf16 moments train; each bad setting ends with exit 2 and one error line naming the key,
# before anything is written (offload with ZeRO-1 over two processes included).
# Usage: offload.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

losses() { grep '"kind":"train"' "$1/metrics.jsonl" | sed 's/.*"loss":\([^,]*\).*/\1/'; }
"$BIN" train "${COMMON[@]}" --set run.dir=device --set train.steps=6 > device.out 2>&1 || fail "on device: $(tail -3 device.out)"
"$BIN" train "${COMMON[@]}" --set run.dir=off --set train.steps=6 --set optim.offload=cpu > off.out 2>&1 ||
    fail "offload: $(tail -3 off.out)"
grep -q 'optimizer offload: master weights and f32 AdamW moments in host memory' off.out || fail "no offload line: $(head -5 off.out)"
[[ -n $(losses device) && "$(losses device)" == "$(losses off)" ]] ||
    fail "offload: losses $(losses off | tr '\n' ' ') differ from on-device $(losses device | tr '\n' ' ')"
"$BIN" train "${COMMON[@]}" --set run.dir=bf16 --set train.steps=6 --set optim.state_dtype=bf16 > bf16.out 2>&1 ||
    fail "bf16 state: $(tail -3 bf16.out)"
[[ $(losses bf16 | wc -l) -eq 6 ]] || fail "bf16 state: $(losses bf16 | wc -l) train lines"

bad_setting 'optim.offload = "cpu" supports optim.name = "adamw" only, not "muon"' optim.offload=cpu optim.name=muon
# A layout the one process cannot fill: exit 2 before run.dir exists.
bad_setting 'parallel.tp x cp x ep x pp = 2 x 1 x 1 x 1 = 2 does not divide the 1 process' parallel.tp=2
bad_setting 'optim.offload' optim.offload=gpu
bad_setting 'optim.state_dtype' optim.state_dtype=f16

# ZeRO-1 over two data-parallel ranks shards the optimizer; the offloaded one updates the whole arena.
mpirun --allow-run-as-root --oversubscribe -np 2 "$BIN" train "${COMMON[@]}" --set run.dir=bad --set optim.offload=cpu \
    > zero.out 2> zero.err
rc=$?
[[ $rc -eq 2 ]] || fail "offload with ZeRO-1 over 2 ranks: exit $rc, expected 2: $(cat zero.err)"
grep -qF 'optim.offload = "cpu" with parallel.zero_stage = 1 over 2 data-parallel ranks' zero.err ||
    fail "offload with ZeRO-1: $(cat zero.err)"
finish offload
