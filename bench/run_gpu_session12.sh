#!/usr/bin/env bash
# Session 12 device call (2026-12-02): every GPU test (ctest -L gpu) and
# dtype_bench twice at N = 10000 (every dtype and promoted pair against a
# D2D copy). The pack is one xz tarball (.gpu/pack.tar.xz: the pack_gpu.sh
# tree, 91 MiB unpacked, 12 MiB packed, so every GPU test fits one call).
# From the repository root, carry .gpu:
#   bench/run_gpu_session12.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
( time ctest --test-dir build -L gpu --output-on-failure ) > $R/ctest_gpu_$C.log 2>&1
tail -16 $R/ctest_gpu_$C.log
for r in 1 2; do
  build/bench/dtype_bench --n=10000 --out=$R/dtype_bench_${C}_$r.md > /dev/null 2>&1
  tail -1 $R/dtype_bench_${C}_$r.md
done
grep -h "MISSED" $R/dtype_bench_${C}_*.md
tar czf $OUT/session12.tgz -C $OUT r
