#!/usr/bin/env bash
# Configures and builds dgmm into ${BUILD_DIR:-build}. CUDA is used when nvcc
# is found (DGMM_CUDA=AUTO|ON|OFF overrides). Shared by ./run.sh, ./test.sh
# and docker/Dockerfile.
#
# With ccache installed (scripts/install-deps.sh build installs it; the
# image's build stage does not have it), the compilers run through it, with
# CCACHE_BASEDIR at the checkout's root so that a fresh clone, wherever it
# lies, reuses what earlier builds of the same sources compiled on this
# machine. DGMM_CCACHE=0 turns that off.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
launchers=()
if [[ ${DGMM_CCACHE:-1} != 0 ]] && command -v ccache > /dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
  launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
  -DDGMM_CUDA="${DGMM_CUDA:-AUTO}" "${launchers[@]}" ${CMAKE_ARGS:-}
cmake --build "$build" -j"$jobs" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
