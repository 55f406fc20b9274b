#!/usr/bin/env bash
# Session 16's device calls: the issue 25 and 26 targets printed once more on
# the tree that resolves them, and `ctest -L gpu` on it. Pack with
#   DGMM_PACK_XZ=1 bench/pack_gpu.sh '.'
# carry .gpu; from the repository root:
#   bench/run_gpu_session16.sh COMMIT user    # user_path_bench (issue 25) + small_job_bench
#   bench/run_gpu_session16.sh COMMIT wire    # stripe_bench.sh + stream_bench.sh (issue 26)
#   bench/run_gpu_session16.sh COMMIT ctest   # ctest -L gpu, every GPU test
# Each step has its own timeout and is archived as soon as it ends
# ($OUT/session16_STEP.tgz: only a few files come back from a call).
source bench/gpu_call_prelude.sh "$@"
step=${2:?user, wire or ctest}
start=$(date +%s)
save() { tar czf $OUT/session16_$step.tgz -C $OUT r; echo "-- $1 done at $(( $(date +%s) - start )) s"; }
case $step in
  user)
    timeout 280 bash bench/run_gpu_user_path.sh $C build --n 10000 20000 --reps 3 > $R/user_path_run.log 2>&1
    cp $OUT/user_path.md $OUT/user_path_console.log $OUT/host_facts.log $R/ 2>/dev/null
    grep -E "MET|MISSED" $R/user_path.md | head -30; save user_path
    pf=$(mktemp -u)
    build/service/dgmm-server --listen=127.0.0.1:0 --port_file=$pf --allow_regions=false > $R/small_server.log 2>&1 &
    spid=$!
    for i in $(seq 100); do [ -s $pf ] && break; sleep 0.1; done
    { echo "# date=$(date -u +%FT%TZ) commit=$C gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
      echo "# command: dgmm-server --listen=127.0.0.1:0 --port_file=P --allow_regions=false ; small_job_bench --server=127.0.0.1:PORT --threads=1,8 --seconds=3 --batch= --server_pid=PID (3 rounds)"
      for round in 1 2 3; do
        echo "## round $round"
        timeout 40 build/bench/small_job_bench --server=127.0.0.1:$(cat $pf) --threads=1,8 --seconds=3 --batch= --server_pid=$spid
      done; } > $R/small_jobs_$C.md 2>&1
    kill $spid; wait $spid 2>/dev/null
    grep -E "^## |MET|MISSED" $R/small_jobs_$C.md; save small_jobs ;;
  wire)
    timeout 330 bash bench/run_gpu_wire.sh $C build stripe stream > $R/wire_console.log 2>&1
    tail -40 $R/wire_console.log; cp $OUT/stripe_bench.md $OUT/stream_bench.md $OUT/wire_run.tar.gz $R/ 2>/dev/null
    save wire ;;
  ctest)
    cd build && timeout 500 ctest -L gpu --output-on-failure > $R/ctest_gpu_$C.log 2>&1; cd ..
    tail -20 $R/ctest_gpu_$C.log; save ctest ;;
esac
