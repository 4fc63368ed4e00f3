#!/usr/bin/env bash
# Installs the dependencies, builds moetrain, prepares the default corpus (Debian's fortunes) and trains
# configs/tiny.toml. This is the README's first command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
build/moetrain data --out data/fortunes
build/moetrain train --config configs/tiny.toml "$@"
