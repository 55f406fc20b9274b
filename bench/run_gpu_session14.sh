#!/usr/bin/env bash
# Session 14's device call: (1) small jobs with MultiplySmall (the default
# server) against the same server with --multiply_small=false (the client
# then sends them with Multiply, as before), in turns, 3 rounds,
# small_job_bench at 1 and 8 threads; (2) perf of the server under one
# thread of 1x1 jobs, both ways (where the server's CPU per job goes);
# (3) ctest -L gpu without server_gpu_test. (Its run at 6061675 printed the
# perf reports with call graphs, cut at 120 lines; flat, -g none, since.) Pack with
# DGMM_PACK_XZ=1 bench/pack_gpu.sh '.'; carry .gpu:
#   bench/run_gpu_session14.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
start=$(date +%s)
save() { tar czf $OUT/session14.tgz -C $OUT r; echo "-- $1 done at $(( $(date +%s) - start )) s"; }
serve() {  # serve FLAGS...: starts a server, sets spid and port
  local pf; pf=$(mktemp -u)
  build/service/dgmm-server --listen=127.0.0.1:0 --port_file=$pf --allow_regions=false "$@" > $R/server_$$.log 2>&1 &
  spid=$!
  for i in $(seq 100); do [ -s $pf ] && break; sleep 0.1; done
  port=$(cat $pf)
}
{ echo "# date=$(date -u +%FT%TZ) commit=$C gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
  echo "# command per row: dgmm-server --listen=127.0.0.1:0 --allow_regions=false [--multiply_small=false] ; small_job_bench --server=127.0.0.1:PORT --threads=1,8 --seconds=2 --batch= --server_pid=PID"
  for round in 1 2 3; do
    for ms in true false; do
      serve --multiply_small=$ms
      echo; echo "## round $round --multiply_small=$ms"
      timeout 60 build/bench/small_job_bench --server=127.0.0.1:$port --threads=1,8 --seconds=2 --batch= --server_pid=$spid
      kill $spid; wait $spid 2>/dev/null
    done
  done; } > $R/small_ab_$C.md 2>&1
cat $R/small_ab_$C.md; save small_ab
PERF=$(command -v perf || true)
if [[ -z "$PERF" && -f build/bench/perf.tar.xz ]]; then
  mkdir -p /tmp/perfb && tar xJf build/bench/perf.tar.xz -C /tmp/perfb
  cat > /tmp/perfb/run <<'W'
#!/bin/bash
LD_LIBRARY_PATH=/tmp/perfb/lib exec /tmp/perfb/perf "$@"
W
  chmod +x /tmp/perfb/run
  PERF=/tmp/perfb/run
fi
{ echo "perf: ${PERF:-none}"; [[ -n "$PERF" ]] && "$PERF" --version; cat /proc/sys/kernel/perf_event_paranoid; } > $R/perf_info.txt 2>&1
if [[ -n "$PERF" ]]; then
  for ms in true false; do
    serve --multiply_small=$ms
    timeout 30 build/bench/small_job_bench --server=127.0.0.1:$port --loop_1x1_seconds=1 > /dev/null 2>&1
    timeout 40 "$PERF" record -e cpu-clock -F 2999 -g -p $spid -o /tmp/perf_$ms.data -- sleep 6 > $R/perf_record_$ms.log 2>&1 &
    ppid=$!
    sleep 0.5
    timeout 30 build/bench/small_job_bench --server=127.0.0.1:$port --loop_1x1_seconds=5 > $R/perf_rate_$ms.txt 2>&1
    wait $ppid
    kill $spid; wait $spid 2>/dev/null
    timeout 60 "$PERF" report -i /tmp/perf_$ms.data --no-children --sort dso,sym --stdio -g none 2>/dev/null | grep -v "^#" | head -80 > $R/perf_top_$ms.txt
    timeout 60 "$PERF" report -i /tmp/perf_$ms.data --no-children --sort comm --stdio -g none 2>/dev/null | grep -v "^#" | head -20 > $R/perf_comm_$ms.txt
  done
fi
save perf
cd build && timeout 300 ctest -L gpu -E server_gpu_test --output-on-failure > $R/ctest_gpu_$C.log 2>&1; cd ..
tail -25 $R/ctest_gpu_$C.log; save ctest
