#!/usr/bin/env bash
# Ran at d368fdb, when the server had --cuda_zero_copy (removed again after
# these runs, bench/results/zero_copy/): at a later commit its zero-copy
# A/B steps fail on the unknown flag. Kept as the record of the command.
# Session 13's second device call: zero copy at small N (zero_copy_bench,
# and dgmm.empty jobs through the server with --cuda_zero_copy on and off
# in turns), the zero-copy path's client tests, and bench/wire_ab.sh's
# HTTP/2 settings (issue 26). Tarred after each step ($OUT/session13b.tgz).
# Pack with DGMM_PACK_XZ=1 bench/pack_gpu.sh '.'; carry .gpu:
#   bench/run_gpu_session13b.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
start=$(date +%s)
save() { tar czf $OUT/session13b.tgz -C $OUT r; echo "-- $1 done at $(( $(date +%s) - start )) s"; }
{ echo "# $(date -u +%FT%TZ) commit $C: build/bench/zero_copy_bench --n=1000,2000,4000 --reps=50"
  timeout 60 build/bench/zero_copy_bench --n=1000,2000,4000 --reps=50; } > $R/zero_copy_small_$C.md 2>&1
grep -E "^N=|floor|server policy" $R/zero_copy_small_$C.md; save zero_copy
for zc in true false; do
  printf '#!/bin/sh\nexec %s/build/service/dgmm-server --cuda_zero_copy=%s "$@"\n' "$PWD" $zc > /tmp/server_zc_$zc
  chmod +x /tmp/server_zc_$zc
done
{ echo "# $(date -u +%FT%TZ) commit $C: small_region_job_bench.py --backend cuda --server-bin /tmp/server_zc_true --server-bin /tmp/server_zc_false --n 1000 2000 4000 --rounds 2 --jobs 200 (each wrapper: dgmm-server --cuda_zero_copy=true|false)"
  timeout 120 python3 bench/small_region_job_bench.py --backend cuda --server-bin /tmp/server_zc_true \
    --server-bin /tmp/server_zc_false --n 1000 2000 4000 --rounds 2 --jobs 200; } > $R/zero_copy_jobs_$C.md 2>&1
cat $R/zero_copy_jobs_$C.md; save zero_copy_jobs
( time timeout 90 ctest --test-dir build -R "dtype_client_gpu_test|python_regions_gpu" --output-on-failure ) \
  > $R/ctest_zc_$C.log 2>&1
tail -8 $R/ctest_zc_$C.log; save ctest
timeout 170 bash bench/wire_ab.sh --build build --n 20000 --reps 3 base frame cbdp0 frame_cbdp0 base \
  > $R/wire_ab_$C.csv 2>&1
cat $R/wire_ab_$C.csv; save wire_ab
