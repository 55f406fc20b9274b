#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# `source .gpu/env.sh`: the GPU tests, then the benchmark. Everything it
# writes goes to $OUT (or ./gpu-out), each log headed with the date, the GPU,
# the commit and the command.
#
#   bench/run_gpu.sh COMMIT [BUILD_DIR] [bench flags...]
set -uo pipefail
# shellcheck source=bench/gpu_run_setup.sh
source "$(dirname "$0")/gpu_run_setup.sh"  # commit, build, out, header; shifts 2
tests_cmd="ctest --test-dir $build -L gpu --output-on-failure"
{ header "$tests_cmd -V"; nvidia-smi; $tests_cmd -V 2>&1; echo "ctest exit: $?"; } \
  > "$out/gpu_tests.log" 2>&1
tail -n 25 "$out/gpu_tests.log"
bench_cmd="$build/bench/gpu_bench --out_dir=$out --commit=$commit $*"
{ header "$bench_cmd"; $bench_cmd 2>&1; echo "gpu_bench exit: $?"; } > "$out/gpu_bench.log" 2>&1
cat "$out/gpu_bench.log"
for f in gpu_bench.md gpu_bench.csv; do
  [[ -f $out/$f ]] || continue
  { header "$bench_cmd"; cat "$out/$f"; } > "$out/$f.tmp" && mv "$out/$f.tmp" "$out/$f"
done
