#!/usr/bin/env bash
# Session 15's second device call: server_gpu_test at the commit with inline
# unary reactions (every GPU test of the server through the real RPCs), then
# three more rounds of the small-job A/B of run_gpu_session15.sh (the new
# server and build/service/dgmm-server-before in turns). Pack with
#   DGMM_PACK_XZ=1 bench/pack_gpu.sh 'server_gpu_test|small_job_bench'
# carry .gpu; from the repository root:
#   bench/run_gpu_session15b.sh COMMIT BEFORE_COMMIT
source bench/gpu_call_prelude.sh "$@"
B=${2:?the commit of dgmm-server-before}
start=$(date +%s)
save() { tar czf $OUT/session15b.tgz -C $OUT r; echo "-- $1 done at $(( $(date +%s) - start )) s"; }
cd build && timeout 330 ctest -R '^server_gpu_test$' --output-on-failure > $R/server_gpu_test_$C.log 2>&1; cd ..
tail -8 $R/server_gpu_test_$C.log; save server_gpu_test
serve() {
  local bin=$1 pf; shift; pf=$(mktemp -u)
  $bin --listen=127.0.0.1:0 --port_file=$pf --allow_regions=false "$@" > $R/server_$$.log 2>&1 &
  spid=$!
  for i in $(seq 100); do [ -s $pf ] && break; sleep 0.1; done
  port=$(cat $pf)
}
NEW=build/service/dgmm-server
OLD=build/service/dgmm-server-before
{ echo "# date=$(date -u +%FT%TZ) gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
  echo "# inline: commit $C ($NEW); before: commit $B ($OLD)"
  echo "# command per row: dgmm-server --listen=127.0.0.1:0 --allow_regions=false ; small_job_bench --server=127.0.0.1:PORT --threads=1,8 --seconds=2 --batch= --server_pid=PID"
  for round in 4 5 6; do
    for which in before inline; do
      bin=$NEW; [[ $which == before ]] && bin=$OLD
      serve $bin
      echo; echo "## round $round: $which"
      timeout 60 build/bench/small_job_bench --server=127.0.0.1:$port --threads=1,8 --seconds=2 --batch= --server_pid=$spid
      kill $spid; wait $spid 2>/dev/null
    done
  done; } > $R/small_ab2_$C.md 2>&1
grep -E "^## |^\| 1 \| [0-9]|^\| 8 \| [0-9]|1x1 job" $R/small_ab2_$C.md | head -60; save small_ab2
