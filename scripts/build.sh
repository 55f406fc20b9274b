#!/usr/bin/env bash
# Configures and builds dgmm into ${BUILD_DIR:-build}. CUDA is used when nvcc
# is found (DGMM_CUDA=AUTO|ON|OFF overrides). Shared by ./run.sh, ./test.sh
# and docker/Dockerfile.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
  -DDGMM_CUDA="${DGMM_CUDA:-AUTO}" ${CMAKE_ARGS:-}
cmake --build "$build" -j"$jobs" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
