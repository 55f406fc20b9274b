#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# `source .gpu/env.sh`: the regions tests on the GPU (the Python client's
# host and CUDA IPC regions, tests/gpu/regions_gpu_test.py, plus every other
# ctest of label gpu whose name has "region" in it) and the regions
# benchmark (bench/region_bench.py --mode gpu: N = 4000, 10000, 20000
# float32; the client is this script's Python process, the server a separate
# one). Everything goes to $OUT (or ./gpu-out), each log headed with the
# date, the GPU, the commit and the command; the benchmark's table, JSON and
# plot go to $OUT/regions/.
#
#   bench/run_gpu_regions.sh COMMIT [BUILD_DIR] [region_bench.py flags...]
#
# The Python there must have NumPy, CuPy and grpcio (the GPU machine's
# `python3` has them; set DGMM_BENCH_PYTHON to use another). Build first
# with CUDA (dgmm-server and dgmm_python_stubs), pack with
# ../shared/device/pack.sh and carry `.gpu` (see bench/results/README.md).
set -uo pipefail
# shellcheck source=bench/gpu_run_setup.sh
source "$(dirname "$0")/gpu_run_setup.sh"  # commit, build, out, header; shifts 2
python=${DGMM_BENCH_PYTHON:-python3}
# The package as the build staged it (its sources, stubs and dgmm._core for
# each Python it was built for); the source tree has no _core.
if [[ -d $build/python/dgmm ]]; then
  export PYTHONPATH=$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD/client/python${PYTHONPATH:+:$PYTHONPATH}
fi
# The stubs the build generated, when it did; else the package makes its own.
[[ -d $build/tests/python/client_python/proto_py ]] &&
  export DGMM_PY_PROTO_DIR=$PWD/$build/tests/python/client_python/proto_py
export DGMM_SERVER_BIN=$build/service/dgmm-server

tests_cmd="ctest --test-dir $build -L gpu -R region --output-on-failure"
{
  header "$tests_cmd -V"
  $tests_cmd -V 2>&1
  echo "ctest exit: $?"
  # The same Python test directly with this machine's python3, in case
  # ctest's interpreter (DGMM_PYTHON, fixed at configure time) lacks CuPy.
  header "$python tests/gpu/regions_gpu_test.py -v"
  "$python" tests/gpu/regions_gpu_test.py -v 2>&1
  echo "regions_gpu_test exit: $?"
} > "$out/regions_gpu_tests.log" 2>&1
tail -n 20 "$out/regions_gpu_tests.log"

bench_cmd="$python bench/region_bench.py --server $DGMM_SERVER_BIN --mode gpu --commit $commit --out $out/regions $*"
{ header "$bench_cmd"; $bench_cmd 2>&1; echo "region_bench exit: $?"; } > "$out/region_bench_console.log" 2>&1
tail -n 40 "$out/region_bench_console.log"
