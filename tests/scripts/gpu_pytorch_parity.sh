#!/usr/bin/env bash
# Whole-model parity on the GPU: moetrain's bf16 (and fp16) mixed-precision loss and gradients against the PyTorch
# reference (tools/reference/model.py) at the same parameters, with PyTorch's own bf16/fp16 errors printed beside
# them (check_parity.py --half). Trains the tiny config 2 steps on the GPU with a checkpoint at step 2, dumps one
# batch's gradients there on the GPU, and compares on the GPU (--device cuda) when the Python has CUDA, else on
# the CPU. Exits 77 (CTest: skipped) without a GPU.
# Usage (CTest): bash gpu_pytorch_parity.sh <moetrain-binary> <source-dir> <scratch-dir>
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 <moetrain-binary> <source-dir> <scratch-dir>" >&2
    exit 2
fi
MOETRAIN=$(realpath "$1")
SRC=$(realpath "$2")
SCRATCH=$3
PYTHON=${MT_REFERENCE_PYTHON:-/usr/bin/python3}
TOL=${MT_GPU_PARITY_TOL:-3e-2}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_pytorch_parity: SKIPPED: no GPU on this machine"
    exit 77
fi
if ! "$PYTHON" -c 'import torch, tomllib' >/dev/null 2>&1; then
    echo "gpu_pytorch_parity: FAIL: $PYTHON cannot import torch (set MT_REFERENCE_PYTHON)" >&2
    exit 1
fi
REF_DEVICE=cpu
if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    REF_DEVICE=cuda
fi

rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
SCRATCH=$(realpath "$SCRATCH")
cd "$SCRATCH"
"$PYTHON" - <<'PY'
import random
rng = random.Random(1234)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial kings".split()
with open("input.txt", "w") as f:
    for _ in range(3000):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))).capitalize() + ".\n%\n")
PY
"$MOETRAIN" data --input input.txt --out data

run_case() {
    local name=$1 precision=$2
    shift 2
    echo "== [$name] moetrain train on cuda, $precision (2 steps, checkpoint at step 2) $*"
    "$MOETRAIN" train --config "$SRC/configs/tiny.toml" --device cuda \
        --set run.precision="\"$precision\"" \
        --set train.steps=2 \
        --set checkpoint.every_steps=2 \
        --set run.dir="$SCRATCH/run_$name" \
        --set data.paths="[\"$SCRATCH/data/train.bin\"]" \
        --set data.val_paths="[\"$SCRATCH/data/val.bin\"]" \
        "$@"
    local ckpt=$SCRATCH/run_$name/checkpoints/step_00000002
    echo "== [$name] moetrain grad-dump on cuda"
    "$MOETRAIN" grad-dump --checkpoint "$ckpt" --out "$SCRATCH/grads_$name.safetensors" \
        --set run.device='"cuda"' --set run.precision="\"$precision\""
    echo "== [$name] check_parity (references on $REF_DEVICE, tol $TOL)"
    "$PYTHON" "$SRC/tools/reference/check_parity.py" --checkpoint "$ckpt" --device "$REF_DEVICE" \
        --dump "$SCRATCH/grads_$name.safetensors" --tol "$TOL" --half "$precision"
}

run_case bf16 bf16
run_case untied_bf16 bf16 --set model.tie_embeddings=false --set model.n_kv_heads=1 --set model.head_dim=16
run_case fp16 fp16
echo "gpu_pytorch_parity: PASS"
