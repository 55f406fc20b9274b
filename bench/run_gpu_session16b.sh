#!/usr/bin/env bash
# Session 16's fourth device call (issue 26, the K=8 plateau): the host's
# memcpy bandwidth out of cache (bench/copy_bandwidth_bench, 1-16 threads),
# then bench/wire_ab.sh base vs malloc (glibc keeping freed memory, so
# gRPC's receive slices come from pages already faulted in), in turns.
# Pack with DGMM_PACK_XZ=1 bench/pack_gpu.sh 'copy_bandwidth_bench|stripe_bench';
# carry .gpu:
#   bench/run_gpu_session16b.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
start=$(date +%s)
save() { tar czf $OUT/session16b.tgz -C $OUT r; echo "-- $1 done at $(( $(date +%s) - start )) s"; }
{ echo "# date=$(date -u +%FT%TZ) commit=$C gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader) cpus: $(nproc)"
  echo "# command: build/bench/copy_bandwidth_bench --threads=1,2,4,8,16 --mib=256 --reps=5"
  timeout 120 build/bench/copy_bandwidth_bench --threads=1,2,4,8,16 --mib=256 --reps=5; } > $R/copy_bandwidth_$C.md 2>&1
cat $R/copy_bandwidth_$C.md; save copy
{ echo "# date=$(date -u +%FT%TZ) commit=$C command: bench/wire_ab.sh --build build --n 20000 --reps 3 base malloc base malloc base malloc"
  timeout 240 bash bench/wire_ab.sh --build build --n 20000 --reps 3 base malloc base malloc base malloc; } > $R/wire_ab_malloc_$C.csv 2>&1
cat $R/wire_ab_malloc_$C.csv; save wire_ab
