#!/usr/bin/env bash
# Session 13's last device call: every GPU test but server_gpu_test (which
# no change of the session touches, 264 s) at the session's final code,
# and small dgmm.empty jobs on the default server. Pack with
# DGMM_PACK_XZ=1 bench/pack_gpu.sh '.'; carry .gpu:
#   bench/run_gpu_session13e.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
( time timeout 240 ctest --test-dir build -L gpu -E server_gpu_test --output-on-failure ) > $R/ctest_gpu_$C.log 2>&1
tail -16 $R/ctest_gpu_$C.log
{ echo "# $(date -u +%FT%TZ) commit $C: small_region_job_bench.py --backend auto --n 16 100 1000 --rounds 2 --jobs 300"
  timeout 100 python3 bench/small_region_job_bench.py --backend auto --n 16 100 1000 --rounds 2 --jobs 300; } > $R/small_region_$C.md 2>&1
cat $R/small_region_$C.md
tar czf $OUT/session13e.tgz -C $OUT r
