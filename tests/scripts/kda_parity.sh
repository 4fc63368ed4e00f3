#!/usr/bin/env bash
# KDA layer parity against the independent PyTorch reference (tools/reference/kda.py, a naive token loop): the
# GoogleTest KdaLayerParity.Dump writes the C++ layer's parameters, inputs, outputs and every gradient (both gates,
# f64 and f32) into the scratch dir, and kda.py recomputes them in float64 with autograd and compares by
# rho = |ref - mt| / |ref| (f64 dumps <= 1e-10, f32 dumps <= 1e-5).
# Usage (CTest): bash kda_parity.sh <moetrain-binary> <source-dir> <scratch-dir>
set -euo pipefail
source "$(dirname "$0")/lib/layer_parity.sh"
layer_parity kda_parity KdaLayerParity.Dump MT_KDA_PARITY_DIR 4 tools/reference/kda.py -- "$@"
