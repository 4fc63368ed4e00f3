#!/usr/bin/env bash
# Activation recompute from the CLI ([recompute], docs/training.md "Memory"): a selective and a full run train the
# loss curve of policy none exactly (the same loss on every line of metrics.jsonl), and each bad setting ends with
# exit 2 and one error line naming the key, before anything is written.
# Usage: recompute.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

losses() { grep '"kind":"train"' "$1/metrics.jsonl" | sed 's/.*"loss":\([^,]*\).*/\1/'; }
"$BIN" train "${COMMON[@]}" --set run.dir=none --set train.steps=4 > none.out 2>&1 || fail "policy none: $(tail -3 none.out)"
for policy in 'selective --set recompute.modules=["attn_core","mlp_act","norm"]' 'full --set recompute.every=sqrt'; do
    read -r -a extra <<< "--set recompute.policy=$policy"
    "$BIN" train "${COMMON[@]}" --set run.dir=r --set train.steps=4 "${extra[@]}" > r.out 2>&1 ||
        fail "$policy: $(tail -3 r.out)"
    [[ -n $(losses none) && "$(losses none)" == "$(losses r)" ]] || fail "$policy: losses $(losses r | tr '\n' ' ') differ from none's $(losses none | tr '\n' ' ')"
    rm -rf r
done

bad() {  # expected message, then --set items
    local want=$1
    shift
    local args=()
    for s in "$@"; do args+=(--set "$s"); done
    "$BIN" train "${COMMON[@]}" --set run.dir=bad "${args[@]}" > bad.out 2> bad.err
    local rc=$?
    [[ $rc -eq 2 ]] || fail "$*: exit $rc, expected 2: $(cat bad.err)"
    [[ $(grep -c '^moetrain: error:' bad.err) -eq 1 ]] || fail "$*: expected one error line: $(cat bad.err)"
    grep -qF -- "$want" bad.err || fail "$*: the message does not say '$want': $(cat bad.err)"
    [[ -e bad ]] && fail "$*: run.dir was created"
}
bad 'recompute.modules = "attn" is not one of' recompute.policy=selective 'recompute.modules=["attn"]'
bad 'recompute.every = 99 exceeds model.n_layers' recompute.policy=full recompute.every=99
bad 'recompute.every = "half" is not one of: sqrt' recompute.policy=full recompute.every=half
bad 'recompute.policy = "selective" needs recompute.modules' recompute.policy=selective
bad 'recompute.every = 2 with attnres.mode' recompute.policy=full recompute.every=2 attnres.mode=block
finish recompute
