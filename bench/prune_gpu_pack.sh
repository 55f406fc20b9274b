#!/usr/bin/env bash
# Drops from a packed tree (../shared/device/pack.sh build .gpu) what a GPU
# run does not need, to stay under the device call's 64 MiB: the fuzz build
# and every test binary but the GPU suite's. The CTest files stay, so
# `ctest -L gpu` still finds its tests.
#
#   bench/prune_gpu_pack.sh [.gpu]
set -euo pipefail
dest=${1:-.gpu}
rm -rf "$dest/build/fuzz-build" "$dest/build/tests/deploy/k8s_schema" "$dest/build/tests/node"
find "$dest/build/tests" -type f -perm -u+x ! -path "*/tests/gpu/*" ! -name '*_gpu_test' ! -name '*.py' ! -name '*.sh' -delete
find "$dest/build" -type d -name CMakeFiles -prune -exec rm -rf {} +
du -sh "$dest"
