#!/usr/bin/env bash
# `moetrain plan --memory` through the real CLI (docs/memory_planning.md): the table and the JSON object for the
# shipped configs, kimi_linear_mini (2.57B parameters) planned in a few MB of host memory, the options
# (--world, --device, --set) reaching the plan, and each bad input ending with exit 2 and one error line naming the
# key or the file.
# Usage: plan_memory.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"
plan() { timeout 60 "$BIN" plan "$@"; }
json_int() { grep -o "\"$2\":[0-9]*" <<< "$1" | head -1 | cut -d: -f2; }

# The table: every section, for a dense, a hybrid and an MoE model.
for config in tiny tiny_hybrid tiny_moe dense_1b3 hybrid_1b3; do
    plan --memory --config "$SRC/configs/$config.toml" > table.txt 2> err.txt || fail "$config: $(cat err.txt)"
    for line in "parameters (" "gradients (" "optimizer state" "activations after the forward" \
                "backward workspace" "largest transient" "predicted peak"; do
        grep -qF -- "$line" table.txt || fail "$config: the table has no '$line' line"
    done
done

# JSON, on the GPU by default (run.device = "auto"). The planner must not allocate the model: its peak resident
# memory (GNU time's %M, KiB) stays far below the 10 GB of kimi_linear_mini's f32 weights alone.
out=$(/usr/bin/time -f %M -o rss.txt timeout 60 "$BIN" plan --memory --json \
    --config "$SRC/configs/kimi_linear_mini.toml") || fail "kimi_linear_mini: no plan"
rss_mb=$(($(tail -1 rss.txt) / 1024))
[[ $rss_mb -lt 1024 ]] || fail "planning kimi_linear_mini took $rss_mb MB of host memory (the planner must not allocate the model)"
[[ $out == "{"*"}" && $(wc -l <<< "$out") -eq 1 ]] || fail "--json is not one object on one line: $out"
[[ $(json_int "$out" global) == 2572148880 ]] || fail "kimi_linear_mini: parameters $(json_int "$out" global)"
grep -qF '"device":"cuda"' <<< "$out" || fail "run.device = auto did not plan for cuda"
for key in peak_device_bytes saved_activation_bytes workspace_bytes state_bytes; do
    [[ -n $(json_int "$out" $key) ]] || fail "the JSON has no $key"
done
echo "kimi_linear_mini planned in $rss_mb MB of host memory, peak $(json_int "$out" peak_device_bytes) bytes"

# Options reach the plan: --device cpu (f32), --world with parallel.dp = 0 (ZeRO-1 over 4 ranks: a quarter of the
# moments), --set of the recompute policy (fewer saved bytes), optim.state_dtype (half the moments).
one=$(plan --memory --json --config "$SRC/configs/tiny.toml" --device cpu)
grep -qF '"compute":"f32"' <<< "$one" || fail "--device cpu did not plan f32: $one"
four=$(plan --memory --json --config "$SRC/configs/tiny.toml" --device cpu --world 4)
grep -qF '"dp":4' <<< "$four" || fail "--world 4 did not give dp = 4: $four"
[[ $(($(json_int "$one" optimizer) / 4)) -eq $(json_int "$four" optimizer) ]] ||
    fail "ZeRO-1 over 4 ranks: optimizer $(json_int "$four" optimizer), not a quarter of $(json_int "$one" optimizer)"
full=$(plan --memory --json --config "$SRC/configs/tiny.toml" --device cpu --set recompute.policy=full)
[[ $(json_int "$full" saved_activation_bytes) -lt $(json_int "$one" saved_activation_bytes) ]] ||
    fail "recompute full saves no fewer bytes than none"
half=$(plan --memory --json --config "$SRC/configs/tiny.toml" --device cpu --set optim.state_dtype=bf16)
[[ $(($(json_int "$one" optimizer) / 2)) -eq $(json_int "$half" optimizer) ]] || fail "bf16 moments are not half"

# Bad input: exit 2, one error line, the key or file named.
expect() {  # CODE NEEDLE -- args...
    local code=$1 needle=$2
    shift 3
    plan "$@" > out.txt 2> err.txt
    local rc=$?
    [[ $rc -eq $code ]] || fail "exit $rc, expected $code: $* :: $(cat err.txt)"
    [[ $(grep -c '^moetrain: error:' err.txt) -eq 1 ]] || fail "expected one error line: $* :: $(cat err.txt)"
    grep -qF -- "$needle" err.txt || fail "message lacks '$needle': $* :: $(cat err.txt)"
    echo "ok ($rc): $(head -1 err.txt)"
}
TINY="$SRC/configs/tiny.toml"
expect 2 "pass --memory" -- --config "$TINY"
expect 2 "model.d_modle" -- --memory --config "$TINY" --set model.d_modle=64
printf '[model]\nd_model = = 3\n' > malformed.toml
expect 2 "malformed.toml" -- --memory --config malformed.toml
expect 2 "missing.toml" -- --memory --config missing.toml
expect 2 "parallel.tp" -- --memory --config "$TINY" --set parallel.tp=2
expect 2 "parallel.dp" -- --memory --config "$TINY" --set parallel.dp=2 --world 3
expect 2 "run.precision" -- --memory --config "$TINY" --device cpu --set run.precision=bf16
expect 2 "recompute.every" -- --memory --config "$TINY" --set recompute.policy=full --set recompute.every=99
expect 2 "--config" -- --memory

finish plan_memory
