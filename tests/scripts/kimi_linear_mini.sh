#!/usr/bin/env bash
# configs/kimi_linear_mini.toml shrunk to tiny widths trains on the CPU with a finite loss: everything the config
# sets (the KKKA pattern with the lower-bounded KDA gate and NoPE GQA attention, MoE after one dense layer with a
# shared expert and Quantile Balancing, Block AttnRes over blocks of 8 sub-layers) except the sizes, which the
# overrides below shrink (8 layers: two AttnRes blocks). The full config's parse is ShippedConfigs.* in mt_tests.
# Usage: kimi_linear_mini.sh <moetrain> <source-dir> <scratch-dir>
set -uo pipefail
BIN=$(realpath -- "$1")
SRC=$(realpath -- "$2")
SCRATCH=$3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
cd "$SCRATCH"
fail() { echo "FAIL: $*" >&2; exit 1; }

for i in $(seq 1 300); do printf 'Fortune number %d: the experts route every token to a place.\n%%\n' "$i"; done > corpus.txt
"$BIN" data --input corpus.txt --out data > /dev/null || fail "data preparation"
SHRINK=(--set model.n_layers=8 --set model.d_model=64 --set model.n_heads=4 --set model.n_kv_heads=2
        --set model.head_dim=16 --set model.d_ff=96 --set model.vocab_size=257 --set model.max_seq_len=64
        --set kda.num_heads=4 --set kda.num_v_heads=4 --set kda.head_dim=16 --set kda.head_v_dim=16
        --set moe.num_experts=8 --set moe.top_k=2 --set moe.expert_ffn_dim=32 --set moe.dense_ffn_dim=96
        --set train.seq_len=64 --set train.batch_size=2 --set train.steps=4 --set train.warmup_steps=1
        --set train.lr=3e-3 --set checkpoint.every_steps=0 --set run.device=cpu --set run.threads=2
        --set run.dir=run --set 'data.paths=["data/train.bin"]')
"$BIN" train --config "$SRC/configs/kimi_linear_mini.toml" "${SHRINK[@]}" > log.txt 2>&1 ||
  fail "training exited $?: $(cat log.txt)"
grep -q "step      4/4 | loss" log.txt || fail "no step 4: $(cat log.txt)"
/usr/bin/python3 - run/metrics.jsonl << 'EOF' || fail "metrics: $(cat run/metrics.jsonl | tail -2)"
import json, math, sys, tomllib
lines = [json.loads(l) for l in open(sys.argv[1])]
cfg = tomllib.loads(lines[0]["config_toml"])
assert cfg["model"]["layer_pattern"] == "KKKA" and cfg["model"]["attn_pos"] == "nope", cfg["model"]
assert cfg["attnres"]["mode"] == "block" and cfg["attnres"]["block_size"] == 8, cfg["attnres"]
assert cfg["kda"]["gate"] == "lower_bound", cfg["kda"]
assert cfg["moe"]["balance"] == "quantile" and cfg["moe"]["num_shared_experts"] == 1, cfg["moe"]
train = [l for l in lines if l["kind"] == "train"]
assert len(train) == 4, f"{len(train)} train lines"
for l in train:
    assert "nonfinite" not in l and math.isfinite(l["loss"]), l
    assert 4.0 < l["loss"] < 7.0, f"step {l['step']}: loss {l['loss']} is not near ln 257 = 5.55"
# MoE in layers 1-7 only: layer 0 keeps its dense MLP.
keys = set(train[-1])
assert "moe/max_vio/l01" in keys and "moe/max_vio/l07" in keys and "moe/max_vio/l00" not in keys, sorted(keys)
EOF
echo "kimi_linear_mini: ok"
