#!/usr/bin/env bash
# Gradient parity of moetrain against the independent PyTorch reference (tools/reference/model.py):
# prepare byte-level data, train the tiny config 2 steps with a checkpoint at step 2, dump the gradients of
# one batch at that checkpoint, and compare loss and every gradient with check_parity.py (rho <= 1e-4).
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
TOL=${MT_PARITY_TOL:-1e-4}

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
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))).capitalize() + ".\n")
PY
fi

echo "== moetrain data"
"$MOETRAIN" data --input input.txt --out data
for f in data/train.bin data/val.bin; do
    [[ -s $f ]] || { echo "pytorch_parity: FAIL: moetrain data did not write $f" >&2; exit 1; }
done

echo "== moetrain train (2 steps, checkpoint at step 2)"
"$MOETRAIN" train --config "$SRC/configs/tiny.toml" \
    --set train.steps=2 \
    --set checkpoint.every_steps=2 \
    --set run.dir="$SCRATCH/run" \
    --set data.paths="[\"$SCRATCH/data/train.bin\"]" \
    --set data.val_paths="[\"$SCRATCH/data/val.bin\"]"
CKPT=$SCRATCH/run/checkpoints/step_00000002
for f in rank_00000.safetensors manifest.json DONE; do
    [[ -f $CKPT/$f ]] || { echo "pytorch_parity: FAIL: checkpoint file $CKPT/$f is missing" >&2; exit 1; }
done

echo "== moetrain grad-dump"
"$MOETRAIN" grad-dump --checkpoint "$CKPT" --out "$SCRATCH/grads.safetensors"
[[ -s $SCRATCH/grads.safetensors ]] || { echo "pytorch_parity: FAIL: grad-dump wrote nothing" >&2; exit 1; }

echo "== check_parity (tol $TOL)"
"$PYTHON" "$SRC/tools/reference/check_parity.py" --checkpoint "$CKPT" --dump "$SCRATCH/grads.safetensors" --tol "$TOL"
echo "pytorch_parity: PASS"
