#!/usr/bin/env bash
# MoE layer parity against the independent PyTorch reference (tools/reference/moe.py, a masked loop over experts):
# the GoogleTest MoeLayerParity.Dump writes the C++ layer's parameters, balancing bias, input, outputs, routing, every
# gradient and the balancer's next bias (three variants: QB with normalised gates; aux loss with unnormalised gates
# and two shared experts; sign bias with capacity dropping; f64 and f32 each) into the scratch dir, and moe.py
# recomputes them in float64 with autograd and compares by rho = |ref - mt| / |ref| (f64 dumps <= 1e-10, f32 dumps
# <= 1e-5; the routing must match exactly).
# Usage (CTest): bash moe_parity.sh <moetrain-binary> <source-dir> <scratch-dir>
# The test binary is <dir of moetrain>/tests/mt_tests unless MT_TESTS_BINARY names it.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 <moetrain-binary> <source-dir> <scratch-dir>" >&2
    exit 2
fi
MOETRAIN=$(realpath "$1")
SRC=$(realpath "$2")
SCRATCH=$3
PYTHON=${MT_REFERENCE_PYTHON:-/usr/bin/python3}
TESTS=${MT_TESTS_BINARY:-$(dirname "$MOETRAIN")/tests/mt_tests}

if [[ ! -x "$TESTS" ]]; then
    echo "moe_parity: FAIL: test binary $TESTS is missing or not executable (build mt_tests, or set MT_TESTS_BINARY)" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import torch' >/dev/null 2>&1; then
    echo "moe_parity: FAIL: $PYTHON cannot import torch." >&2
    echo "  HINT: install Debian's python3-torch, or point MT_REFERENCE_PYTHON at an interpreter with torch." >&2
    exit 1
fi

rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
SCRATCH=$(realpath "$SCRATCH")

echo "== mt_tests --gtest_filter=MoeLayerParity.Dump"
MT_MOE_PARITY_DIR="$SCRATCH" "$TESTS" --gtest_filter=MoeLayerParity.Dump --gtest_brief=1
n=$(ls "$SCRATCH"/moe_*.safetensors 2>/dev/null | wc -l)
if [[ $n -ne 6 ]]; then
    echo "moe_parity: FAIL: expected 6 dumps in $SCRATCH, found $n" >&2
    exit 1
fi

echo "== moe.py"
"$PYTHON" "$SRC/tools/reference/moe.py" --dump-dir "$SCRATCH"
echo "moe_parity: PASS"
