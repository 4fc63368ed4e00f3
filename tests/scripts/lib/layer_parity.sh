# Shared body of the layer parity scripts (kda_parity.sh, moe_parity.sh): a GoogleTest "<Layer>Parity.Dump" writes
# the C++ layer's parameters, inputs, outputs and gradients as safetensors into a scratch dir, and an independent
# PyTorch reference in tools/reference/ recomputes them in float64 and compares. Sourced, not run.
# Usage: layer_parity <name> <gtest filter> <dump-dir env var> <expected dumps> <reference script> -- "$@"
# where "$@" is the calling script's <moetrain-binary> <source-dir> <scratch-dir>. The test binary is
# <dir of moetrain>/tests/mt_tests unless MT_TESTS_BINARY names it; the interpreter is MT_REFERENCE_PYTHON or
# /usr/bin/python3 (Debian's python3-torch).
layer_parity() {
    local name=$1 filter=$2 env_var=$3 expected=$4 reference=$5
    shift 6
    if [[ $# -ne 3 ]]; then
        echo "usage: $0 <moetrain-binary> <source-dir> <scratch-dir>" >&2
        exit 2
    fi
    local moetrain src scratch python tests n
    moetrain=$(realpath "$1")
    src=$(realpath "$2")
    scratch=$3
    python=${MT_REFERENCE_PYTHON:-/usr/bin/python3}
    tests=${MT_TESTS_BINARY:-$(dirname "$moetrain")/tests/mt_tests}

    if [[ ! -x "$tests" ]]; then
        echo "$name: FAIL: test binary $tests is missing or not executable (build mt_tests, or set MT_TESTS_BINARY)" >&2
        exit 1
    fi
    if ! "$python" -c 'import torch' >/dev/null 2>&1; then
        echo "$name: FAIL: $python cannot import torch." >&2
        echo "  HINT: install Debian's python3-torch, or point MT_REFERENCE_PYTHON at an interpreter with torch." >&2
        exit 1
    fi

    rm -rf "$scratch"
    mkdir -p "$scratch"
    scratch=$(realpath "$scratch")

    echo "== mt_tests --gtest_filter=$filter"
    env "$env_var=$scratch" "$tests" --gtest_filter="$filter" --gtest_brief=1
    n=$(find "$scratch" -maxdepth 1 -name '*.safetensors' | wc -l)
    if [[ $n -ne $expected ]]; then
        echo "$name: FAIL: expected $expected dumps in $scratch, found $n" >&2
        exit 1
    fi

    echo "== $(basename "$reference")"
    "$python" "$src/$reference" --dump-dir "$scratch"
    echo "$name: PASS"
}
