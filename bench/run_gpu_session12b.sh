#!/usr/bin/env bash
# Session 12's second device call (2026-12-02): where a dgmm.empty job's time
# outside the server goes. small_region_job_bench (wall per job against the
# server's own JobStats total) on the GPU (--backend=auto: region jobs stay
# on the GPU) and the CPU, N = 16 and 1000; then dgmm.empty at N = 10000 in
# turns with the duplex floor (user_path_bench), with the client's region
# call waiting as before and polling without sleeping
# (DGMM_REGION_SPIN_MS=50, an experiment in the Python binding at cc32e82,
# removed since: it changed nothing), in turns.
# From the repository root, carry .gpu:
#   bench/run_gpu_session12b.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
for v in "auto 0" "auto 50"; do
  set -- $v
  DGMM_REGION_SPIN_MS=$2 timeout 60 python3 bench/small_region_job_bench.py --backend $1 --n 16 1000 \
    --rounds 1 --jobs 300 > $R/small_region_$1_spin$2.md 2>&1
  echo "== backend $1 spin $2"; cat $R/small_region_$1_spin$2.md | tail -4
done
for r in 1; do
  for sp in 0 50; do
    DGMM_REGION_SPIN_MS=$sp timeout 120 python3 bench/user_path_bench.py --build build --commit $C \
      --n 10000 --reps 9 --only empty cupy --out $R/empty_spin${sp}_$r.md > $R/empty_spin${sp}_${r}_console.log 2>&1
    echo "== spin $sp round $r"; grep -E "in turns|dgmm.empty \|" $R/empty_spin${sp}_$r.md
  done
done
tar czf $OUT/session12b.tgz -C $OUT r
