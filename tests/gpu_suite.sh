#!/usr/bin/env bash
# The whole GPU suite, the same way every time (run it before resolving an issue that touched CUDA code, and put the
# count it prints in the closing note): configures and builds moetrain for the H200 (sm_90a) in build-gpu (or $1)
# and runs every CTest entry with the label gpu (op parity, the Gpu* suites, gpu_*.sh scripts, the NCCL mpi entries),
# with no filter. The PyTorch reference is /usr/bin/python3, or the python3 on PATH where that one has no torch (the
# device image). On the device machine, first: source .device-deps/device-setup.sh (docs/testing.md).
set -euo pipefail; cd "$(dirname "$0")/.."; B=${1:-build-gpu}; export NCCL_NVLS_ENABLE=0; /usr/bin/python3 -c 'import torch' 2>/dev/null || export MT_REFERENCE_PYTHON=${MT_REFERENCE_PYTHON:-$(command -v python3)}; cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=ON >/dev/null && cmake --build "$B" -j "$(nproc)" && ctest --test-dir "$B" -L gpu --output-on-failure --timeout 900 -j 1
