#!/usr/bin/env bash
# MoE layer parity against the independent PyTorch reference (tools/reference/moe.py, a masked loop over experts):
# the GoogleTest MoeLayerParity.Dump writes the C++ layer's parameters, balancing bias, input, outputs, routing, every
# gradient and the balancer's next bias (three variants: QB with normalised gates; aux loss with unnormalised gates
# and two shared experts; sign bias with capacity dropping; f64 and f32 each) into the scratch dir, and moe.py
# recomputes them in float64 with autograd and compares by rho = |ref - mt| / |ref| (f64 dumps <= 1e-10, f32 dumps
# <= 1e-5; the routing must match exactly).
# Usage (CTest): bash moe_parity.sh <moetrain-binary> <source-dir> <scratch-dir>
set -euo pipefail
source "$(dirname "$0")/lib/layer_parity.sh"
layer_parity moe_parity MoeLayerParity.Dump MT_MOE_PARITY_DIR 6 tools/reference/moe.py -- "$@"
