#!/usr/bin/env bash
# Packs a local sm_90a build (this machine compiles CUDA; the default CMAKE_CUDA_ARCHITECTURES is 90a) for the device
# machine, so a device call runs the binaries instead of spending minutes building them: the stripped moetrain,
# test and benchmark binaries and the CTest files, into .devbin/build.tar.xz (add /.devbin/ to .git/info/exclude).
# On the device, in the repository root, with carry [".device-deps", ".devbin"]:
#   source .device-deps/device-setup.sh && mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; } &&
#   tar -xJf .devbin/build.tar.xz && ctest --test-dir build -L gpu --timeout 300 -j 1
# (the CTest files name the binaries by their absolute path here, /work/main/build/...).
#   scripts/pack_device_build.sh [BUILD_DIR]     (default build; it must be at /work/main/build for the CTest paths)
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
grep -q '^/.devbin/' .git/info/exclude 2> /dev/null || echo '/.devbin/' >> .git/info/exclude
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/tests" "$stage/build/bench"
cp "$build/CTestTestfile.cmake" "$build/moetrain" "$stage/build/"
cp "$build/tests/CTestTestfile.cmake" "$build"/tests/mt_tests*cmake "$build/tests/mt_tests" "$build/tests/mt_mpi_tests" \
    "$stage/build/tests/"
cp "$build/bench/CTestTestfile.cmake" "$build"/bench/bench_* "$stage/build/bench/"
find "$stage" -type f -perm -u+x -exec strip {} \;
mkdir -p .devbin
tar -C "$stage" -cJf .devbin/build.tar.xz build
ls -l .devbin/build.tar.xz
