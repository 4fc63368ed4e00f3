#!/usr/bin/env bash
# Gradient parity of moetrain against the independent PyTorch reference (tools/reference/model.py):
# prepare byte-level data, train the tiny config 2 steps with a checkpoint at step 2, dump the gradients of
# one batch at that checkpoint, and compare loss and every gradient with check_parity.py (rho <= 3e-5: measured
# worst 6.2e-6 over the cases below, where the f32 reference is itself up to 2.6e-6 from float64);
# then the same for a variant with untied embeddings, one kv head and an explicit head_dim, and for the hybrid
# model (configs/tiny_hybrid.toml: three KDA layers and a NoPE attention layer; the reference runs KDA as the naive
# token loop of tools/reference/kda.py) on 96-token sequences (the token loop is slow in Python), and a hybrid
# variant with RoPE, grouped value heads and the softplus gate; then MoE models (tiny_moe.toml; with the aux loss and
# capacity dropping; and inside a hybrid model with Block AttnRes).
# Usage (CTest): bash pytorch_parity.sh <moetrain-binary> <source-dir> <scratch-dir>
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 <moetrain-binary> <source-dir> <scratch-dir>" >&2
    exit 2
fi
MOETRAIN=$(realpath "$1")
SRC=$(realpath "$2")
SCRATCH=$3
PYTHON=${MT_REFERENCE_PYTHON:-/usr/bin/python3}
TOL=${MT_PARITY_TOL:-3e-5}

if [[ ! -x "$MOETRAIN" ]]; then
    echo "pytorch_parity: FAIL: moetrain binary $MOETRAIN is missing or not executable" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import torch, tomllib' >/dev/null 2>&1; then
    echo "pytorch_parity: FAIL: $PYTHON cannot import torch (and tomllib, Python >= 3.11)." >&2
    echo "  HINT: install Debian's python3-torch (apt-get install python3-torch), or point" >&2
    echo "        MT_REFERENCE_PYTHON at a Python 3.11+ interpreter that has torch." >&2
    exit 1
fi

rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
SCRATCH=$(realpath "$SCRATCH")
cd "$SCRATCH"

# A single small text input: Debian's fortunes when installed, else generated text (deterministic).
if [[ -f /usr/share/games/fortunes/fortunes ]]; then
    cp /usr/share/games/fortunes/fortunes input.txt
else
    "$PYTHON" - <<'PY'
import random
rng = random.Random(1234)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial kings".split()
with open("input.txt", "w") as f:
    for _ in range(3000):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))).capitalize() + ".\n%\n")
PY
fi

echo "== moetrain data"
"$MOETRAIN" data --input input.txt --out data
for f in data/train.bin data/val.bin; do
    [[ -s $f ]] || { echo "pytorch_parity: FAIL: moetrain data did not write $f" >&2; exit 1; }
done

# One case: train 2 steps with a checkpoint at step 2, dump one batch's gradients there, compare. Document masking
# off: the reference does not model it (check_parity.py refuses such a checkpoint; DocumentMaskModel.* checks it).
# CONFIG (default configs/tiny.toml) names the job config.
run_case() {
    local name=$1
    shift
    local config=${CONFIG:-$SRC/configs/tiny.toml}
    echo "== [$name] moetrain train $(basename "$config") (2 steps, checkpoint at step 2) $*"
    "$MOETRAIN" train --config "$config" \
        --set train.steps=2 \
        --set checkpoint.every_steps=2 \
        --set run.dir="$SCRATCH/run_$name" \
        --set data.paths="[\"$SCRATCH/data/train.bin\"]" \
        --set data.val_paths="[\"$SCRATCH/data/val.bin\"]" \
        --set data.document_mask=false \
        "$@"
    local ckpt=$SCRATCH/run_$name/checkpoints/step_00000002
    for f in rank_00000.safetensors manifest.json DONE; do
        [[ -f $ckpt/$f ]] || { echo "pytorch_parity: FAIL: checkpoint file $ckpt/$f is missing" >&2; exit 1; }
    done

    echo "== [$name] moetrain grad-dump"
    "$MOETRAIN" grad-dump --checkpoint "$ckpt" --out "$SCRATCH/grads_$name.safetensors"
    [[ -s $SCRATCH/grads_$name.safetensors ]] || { echo "pytorch_parity: FAIL: grad-dump wrote nothing" >&2; exit 1; }

    echo "== [$name] check_parity (tol $TOL)"
    "$PYTHON" "$SRC/tools/reference/check_parity.py" --checkpoint "$ckpt" \
        --dump "$SCRATCH/grads_$name.safetensors" --tol "$TOL"
}

# configs/tiny.toml as it is (tied embeddings, 4 query heads over 2 kv heads, head_dim = d_model / n_heads)
run_case tiny
# the other paths: a separate lm_head, 4 query heads sharing 1 kv head, head_dim 16 (Hq * D != d_model)
run_case untied --set model.tie_embeddings=false --set model.n_kv_heads=1 --set model.head_dim=16
# the hybrid model: KDA layers 0-2 (bounded gate, chunk 64, T = 96 crosses a chunk), NoPE attention layer 3
CONFIG=$SRC/configs/tiny_hybrid.toml run_case hybrid --set train.seq_len=96
# K A K A with RoPE on the attention layers, grouped value heads (2 q/k heads, 4 value heads, K = 16, V = 8) and the
# unbounded softplus gate (the pairwise diagonal path), on a small batch
CONFIG=$SRC/configs/tiny_hybrid.toml run_case hybrid_gva --set model.layer_pattern=KA --set model.attn_pos=rope \
    --set kda.num_heads=2 --set kda.num_v_heads=4 --set kda.head_dim=16 --set kda.head_v_dim=8 \
    --set kda.gate=softplus --set train.seq_len=80 --set train.batch_size=4
# Block Attention Residuals: 8 sub-layers in blocks of 3 (3, 3 and a short last block of 2); after two steps the
# pseudo-queries are non-zero, so every mix weighs its sources unevenly
run_case attnres --set attnres.mode=\"block\" --set attnres.block_size=3 --set train.batch_size=8
# Full AttnRes (S = 1) on the hybrid model
CONFIG=$SRC/configs/tiny_hybrid.toml run_case attnres_full_hybrid --set attnres.mode=\"full\" --set train.seq_len=64 \
    --set train.batch_size=4
# MoE (configs/tiny_moe.toml: layer 0 dense, layers 1-3 with 16 experts, top 2, a shared expert, Quantile
# Balancing): after two steps the balancer's bias is non-zero, and the reference routes with the checkpoint's bias
CONFIG=$SRC/configs/tiny_moe.toml run_case moe --set train.batch_size=4
# MoE with the aux loss (its gradient joins the LM loss's), softmax scores, unnormalised gates, two shared experts
# and capacity dropping (capacity factor 1.0 drops the rows above each expert's share, lowest gates first)
CONFIG=$SRC/configs/tiny_moe.toml run_case moe_aux_capacity --set moe.balance=\"aux_loss\" --set moe.score=\"softmax\" \
    --set moe.normalize_gates=false --set moe.num_shared_experts=2 --set moe.capacity_factor=1.0 \
    --set moe.first_k_dense=0 --set train.batch_size=4
# Block AttnRes over a hybrid KDA/attention model whose FFNs are MoE layers (sign-bias balancing)
CONFIG=$SRC/configs/tiny_moe.toml run_case moe_hybrid_attnres --set model.layer_pattern=\"KA\" \
    --set attnres.mode=\"block\" --set attnres.block_size=3 --set moe.balance=\"sign_bias\" \
    --set moe.sign_bias.rate=0.01 --set train.seq_len=64 --set train.batch_size=4
echo "pytorch_parity: PASS"
