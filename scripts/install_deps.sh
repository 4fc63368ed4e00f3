#!/usr/bin/env bash
# Installs moetrain's build, test and run dependencies from Debian 12 packages (needs root or sudo).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends \
    build-essential cmake ninja-build pkg-config git ca-certificates clang-format \
    libopenblas-dev libopenmpi-dev openmpi-bin \
    libgtest-dev libgmock-dev googletest libbenchmark-dev \
    libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libspdlog-dev libfmt-dev \
    libsentencepiece-dev sentencepiece libcpp-httplib-dev \
    libpng-dev libjpeg62-turbo-dev libarchive-dev \
    python3 python3-numpy python3-torch time \
    fortunes fortunes-min base-files \
    chromium fonts-liberation
# chromium: the headless browser of the dashboard test (script.browser_dashboard, label browser); fonts-liberation
# (a recommendation, which --no-install-recommends leaves out) gives its screenshots readable text.
# libpng-dev, libjpeg62-turbo-dev (libjpeg-turbo), libarchive-dev: image-text data on disk (PNG and JPEG images in
# WebDataset tar shards, docs/data.md "Image-text data").
# fortunes: the default corpus of `moetrain data`. base-files (essential, so always there) ships
# /usr/share/common-licenses, the long document of `moetrain data --long-doc` in docs/long_context.md.
