#!/usr/bin/env bash
# Whole-model parity on the GPU: moetrain's bf16 (and fp16) mixed-precision loss and gradients against the PyTorch
# reference (tools/reference/model.py) at the same parameters, with PyTorch's own bf16/fp16 errors beside them
# (check_parity.py --half): every gradient's rho within TOL, and moetrain's worst rho at most HALF_FACTOR times
# autocast PyTorch's worst. Trains the tiny config 2 steps on the GPU with a checkpoint at step 2, dumps one batch's
# gradients there on the GPU, and compares on the GPU (--device cuda) when the Python has CUDA, else on the CPU.
# Cases: head_dim 32 (tiny), 16 (untied, one kv head), 64 and 128 (the bf16 flash attention kernels; the others take
# the generic kernel), and fp16. moetrain runs with scratch poisoning, as the GPU C++ tests do. Exits 77 (CTest:
# skipped) when moetrain sees no GPU.
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
# The device machine's /usr/bin/python3 has no torch while the python3 on its PATH has PyTorch with CUDA: take that
# one when MT_REFERENCE_PYTHON is unset (as tests/gpu_suite.sh does), instead of failing the check below.
if [[ -z ${MT_REFERENCE_PYTHON:-} ]] && ! "$PYTHON" -c 'import torch' > /dev/null 2>&1 &&
    command -v python3 > /dev/null && python3 -c 'import torch' > /dev/null 2>&1; then
    PYTHON=$(command -v python3)
fi
TOL=${MT_GPU_PARITY_TOL:-3e-2}
HALF_FACTOR=${MT_GPU_PARITY_HALF_FACTOR:-2}
# Every scratch block the CUDA backend hands out starts as all-ones bytes (NaN in every float type), as under the GPU
# C++ tests (tests/core/scratch_test.cpp): an output element a kernel never writes shows up as a non-finite gradient.
export MT_SCRATCH_POISON=1

if [[ ! -x "$MOETRAIN" ]]; then
    echo "gpu_pytorch_parity: FAIL: moetrain binary $MOETRAIN is missing or not executable" >&2
    exit 1
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

# Whether moetrain itself can use a GPU (its CUDA path compiled, a device visible; what nvidia-smi says does not
# decide it): one step on cuda, before anything needs torch. Exit 5 saying no CUDA device is available means skip;
# any other failure fails.
probe_rc=0
"$MOETRAIN" train --config "$SRC/configs/tiny.toml" --device cuda --set train.steps=1 \
    --set run.dir="$SCRATCH/run_probe" \
    --set data.paths="[\"$SCRATCH/data/train.bin\"]" \
    --set data.val_paths="[\"$SCRATCH/data/val.bin\"]" >probe.log 2>&1 || probe_rc=$?
if [[ $probe_rc -eq 5 ]] && grep -q "no CUDA device is available" probe.log; then
    echo "gpu_pytorch_parity: SKIPPED: moetrain sees no GPU: $(grep -m1 'error:' probe.log)"
    exit 77
fi
if [[ $probe_rc -ne 0 ]]; then
    cat probe.log >&2
    echo "gpu_pytorch_parity: FAIL: one training step on cuda exited $probe_rc" >&2
    exit 1
fi
echo "== moetrain trains on the GPU (one step on cuda, scratch poisoning on)"

if ! "$PYTHON" -c 'import torch, tomllib' >/dev/null 2>&1; then
    echo "gpu_pytorch_parity: FAIL: $PYTHON cannot import torch (set MT_REFERENCE_PYTHON)" >&2
    exit 1
fi
REF_DEVICE=cpu
if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    REF_DEVICE=cuda
fi

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
        --set data.document_mask=false \
        "$@"
    local ckpt=$SCRATCH/run_$name/checkpoints/step_00000002
    echo "== [$name] moetrain grad-dump on cuda"
    "$MOETRAIN" grad-dump --checkpoint "$ckpt" --out "$SCRATCH/grads_$name.safetensors" \
        --set run.device='"cuda"' --set run.precision="\"$precision\""
    echo "== [$name] check_parity (references on $REF_DEVICE, tol $TOL, at most ${HALF_FACTOR}x torch autocast)"
    "$PYTHON" "$SRC/tools/reference/check_parity.py" --checkpoint "$ckpt" --device "$REF_DEVICE" \
        --dump "$SCRATCH/grads_$name.safetensors" --tol "$TOL" --half "$precision" --half-factor "$HALF_FACTOR"
}

# tiny as it is: head_dim 32, 4 query heads over 2 kv heads
run_case bf16 bf16
run_case untied_bf16 bf16 --set model.tie_embeddings=false --set model.n_kv_heads=1 --set model.head_dim=16
# head_dim 64 and 128: the tensor-core flash kernels (wgmma on Hopper, mma.sync elsewhere), the second with GQA
run_case hd64_bf16 bf16 --set model.n_heads=2 --set model.n_kv_heads=2
run_case hd128_bf16 bf16 --set model.d_model=256 --set model.n_heads=2 --set model.n_kv_heads=1
run_case fp16 fp16
echo "gpu_pytorch_parity: PASS"
