#!/usr/bin/env bash
# Session 13's first device call (~5 min): zero_copy_bench (dgmm's kernel on
# pinned host memory directly, against the duplex floor), then
# bench/run_gpu_latency.sh (small region jobs traced, the pinned-region
# timeline at N = 10000, small_job_bench). Pack with
# DGMM_PACK_XZ=1 bench/pack_gpu.sh 'small_job_bench|zero_copy_bench'.
#   bench/run_gpu_session13.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
{ echo "# $(date -u +%FT%TZ) commit $C: build/bench/zero_copy_bench --n=10000,20000 --reps=15"
  timeout 200 build/bench/zero_copy_bench --n=10000,20000 --reps=15; } > $R/zero_copy_$C.md 2>&1
cat $R/zero_copy_$C.md
bash bench/run_gpu_latency.sh "$@"
