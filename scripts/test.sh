#!/usr/bin/env bash
# Installs the dependencies, builds moetrain with warnings as errors, checks formatting and runs every test.
# This is the README's test command and what CI (.ci/run) runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMT_WERROR=ON
cmake --build build -j "$(nproc)"
git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs -r clang-format --dry-run --Werror
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900
