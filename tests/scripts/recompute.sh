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

bad_setting 'recompute.modules = "attn" is not one of' recompute.policy=selective 'recompute.modules=["attn"]'
bad_setting 'recompute.every = 99 exceeds model.n_layers' recompute.policy=full recompute.every=99
bad_setting 'recompute.every = "half" is not one of: sqrt' recompute.policy=full recompute.every=half
bad_setting 'recompute.policy = "selective" needs recompute.modules' recompute.policy=selective
bad_setting 'recompute.every = 2 with attnres.mode' recompute.policy=full recompute.every=2 attnres.mode=block
finish recompute
