#!/usr/bin/env bash
# Issue 27's kernel checks on the GPU machine in one call (< 90 s on an H200):
# the dtype GPU test, dtype_bench at N = 10000 and CuPy's l[:, None]*A*r.
# Build with CUDA first (targets dtype_kernel_gpu_test and dtype_bench; both
# load only libc, libstdc++ and, at run time, libcublas.so.13), carry the two
# binaries (or a packed .gpu/, see ../shared/device/README.md), then from the
# repository root there:
#
#   bench/run_gpu_dtypes.sh [BUILD_DIR]     # logs to ${OUT:-.}
set -uo pipefail
build=${1:-build}
out=${OUT:-.}
timeout 120 "$build/tests/gpu/dtype_kernel_gpu_test" > "$out/dtype_kernel_gpu_test.log" 2>&1
echo "dtype_kernel_gpu_test exit: $?"
grep -E "PASSED|FAILED|SKIPPED" "$out/dtype_kernel_gpu_test.log" | tail -5
timeout 180 "$build/bench/dtype_bench" --n=10000 --reps=30 --out="$out/dtype_bench.md"
echo "dtype_bench exit: $?"
timeout 120 python3 bench/dtype_cupy_bench.py --n 10000 --reps 30 | tee "$out/dtype_cupy_bench.md"
