#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# `source .gpu/env.sh`: the GPU tests, then how long dgmm-cli processes take
# to exit after their job (issue: 10 s there, 0.04-0.2 s on the build
# machine), under gRPC's settings that could explain it. Logs go to $OUT (or
# ./gpu-out), each headed with the date, the GPU, the commit and the command.
#
#   bench/run_gpu_exit.sh COMMIT [BUILD_DIR]
set -uo pipefail
# shellcheck source=bench/gpu_run_setup.sh
source "$(dirname "$0")/gpu_run_setup.sh"  # commit, build, out, header; shifts 2
# SKIP_GPU_TESTS=1: the GPU tests already ran in this call (run_gpu_stream.sh).
if [[ ${SKIP_GPU_TESTS:-0} != 1 ]]; then
  tests_cmd="ctest --test-dir $build -L gpu --output-on-failure"
  { header "$tests_cmd -V"; $tests_cmd -V 2>&1; echo "ctest exit: $?"; } > "$out/gpu_tests.log" 2>&1
  tail -n 12 "$out/gpu_tests.log"
fi

work=$(mktemp -d)
"$build/service/dgmm-server" --listen=127.0.0.1:0 --port_file="$work/port" --allow_regions=false 2>"$work/server.log" &
server=$!
for _ in $(seq 600); do [[ -s $work/port ]] && break; sleep 0.1; done
addr=127.0.0.1:$(cat "$work/port")
cli="$build/client/cpp/dgmm-cli"
now() { date +%s%N; }
# Prints: label, wall seconds of the whole process, and for a multiply the
# job's own wall time (as dgmm-cli reports it) and whether the process ended
# within 1 s of it.
timed() {
  local label=$1; shift
  local t0 t1 rc job
  t0=$(now)
  "$@" >"$work/last.out" 2>"$work/last.err"; rc=$?
  t1=$(now)
  job=$(sed -n 's/.* \([0-9.]*\) ms wall (client).*/\1/p' "$work/last.out")
  printf '%-58s rc=%d  process %.3f s' "$label" "$rc" "$(( (t1 - t0) / 1000 ))e-6"
  if [[ -n $job ]]; then
    local after_ms=$(( (t1 - t0) / 1000000 - ${job%.*} ))
    printf '  job %s ms  exit %d ms after the job: %s' "$job" "$after_ms" \
      "$([[ $after_ms -lt 1000 ]] && echo "within 1 s: OK" || echo "over 1 s: FAILED")"
  fi
  printf '\n'
}
{
  header "bench/run_gpu_exit.sh $commit $build"
  echo "# /etc/resolv.conf:"; sed 's/^/#   /' /etc/resolv.conf 2>/dev/null
  echo "# nproc: $(nproc)"
  timed "health" "$cli" health --server "$addr"
  for i in 1 2 3; do
    timed "multiply --random=4000 (as shipped: poll) #$i" "$cli" multiply --random=4000 --server "$addr"
    timed "multiply --random=2000 --mode=unary #$i" "$cli" multiply --random=2000 --mode=unary --server "$addr"
    timed "multiply --random=4000 (GRPC_POLL_STRATEGY=epoll1) #$i" env GRPC_POLL_STRATEGY=epoll1 "$cli" multiply --random=4000 --server "$addr"
  done
  timed "info" "$cli" info --server "$addr"
  echo "# with GRPC_VERBOSITY=debug (the iomgr shutdown names what it waits for):"
  GRPC_VERBOSITY=debug "$cli" multiply --random=1000 --server "$addr" 2>&1 |
    grep -E "shutdown|iomgr|LEAKED|Waiting|clean-up|OBJECT" | sed 's/^/#   /' | head -40
  if command -v strace >/dev/null; then
    echo "# strace -f -tt (last 60 lines):"
    strace -f -tt -o "$work/strace" "$cli" health --server "$addr" >/dev/null 2>&1
    tail -n 60 "$work/strace" | sed 's/^/#   /'
  else
    echo "# no strace here"
  fi
} > "$out/cli_exit.log" 2>&1
cat "$out/cli_exit.log"
kill -TERM "$server"; wait "$server"
cp "$work/server.log" "$out/server.log"
rm -rf "$work"
