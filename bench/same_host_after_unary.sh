#!/usr/bin/env bash
# The same-host path after large unary jobs, and dgmm-cli's own --random and
# --check at a large N, on one server (GPU if there is one):
#
#   1. dgmm-server --gpu-memory-budget=1GiB --max_unary_message_bytes=1GiB
#   2. dgmm-cli multiply --random=8000 --mode=unary --max_unary_message_bytes=1GiB --check
#      dgmm-cli multiply --random=15000 --mode=unary --max_unary_message_bytes=1GiB
#      dgmm-cli multiply --random=15000 --check                (same host expected)
#      dgmm-cli multiply --random=15000 --dtype=f64 --check    (same host expected)
#   3. dgmm-cli multiply --random=N_LARGE --check, timed as a whole, next to
#      the RPC time the CLI prints.
#
# Prints, per run, its "path:" line, its "time:"/"rpc" lines and its wall
# time; the runs that must take the same-host path are checked for it.
#
#   bench/same_host_after_unary.sh BUILD_DIR [N_LARGE]    (N_LARGE default 46000)
set -uo pipefail
build=${1:?build dir}
large=${2:-46000}
server=$build/service/dgmm-server
cli=$build/client/cpp/dgmm-cli
work=$(mktemp -d)
trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
"$server" --listen=127.0.0.1:0 --port_file="$work/port" --gpu-memory-budget=1GiB \
  --max_unary_message_bytes=1GiB 2> "$work/server.log" &
pid=$!
for _ in $(seq 300); do [[ -s $work/port ]] && break; sleep 0.1; done
[[ -s $work/port ]] || { cat "$work/server.log"; exit 1; }
addr=127.0.0.1:$(cat "$work/port")
echo "# server: $server --gpu-memory-budget=1GiB --max_unary_message_bytes=1GiB at $addr"
failed=0
run() {  # run EXPECT ARGS...: EXPECT is "same-host" or "-"
  local expect=$1
  shift
  local t0 t1
  t0=$(date +%s%N)
  "$cli" multiply --server="$addr" "$@" > "$work/out" 2>&1
  local rc=$?
  t1=$(date +%s%N)
  echo "## dgmm-cli multiply $*"
  echo "exit $rc, wall $(( (t1 - t0) / 1000000 )) ms"
  grep -E '^(path|timings|phases|mode|check)|relative|OK' "$work/out" || cat "$work/out"
  if [[ $expect == same-host ]] && ! grep -q '^path: *same host' "$work/out"; then
    echo "NOT THE SAME-HOST PATH"
    failed=1
  fi
  (( rc == 0 )) || failed=1
}
run - --random=8000 --mode=unary --max_unary_message_bytes=1GiB --check
run - --random=15000 --mode=unary --max_unary_message_bytes=1GiB
run same-host --random=15000 --check
run same-host --random=15000 --dtype=f64 --check
run same-host --random="$large" --check
echo "## server log (last lines)"
tail -5 "$work/server.log"
exit $failed
