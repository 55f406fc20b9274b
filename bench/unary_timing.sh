#!/usr/bin/env bash
# Times unary Multiply calls through dgmm-cli against one or more dgmm-server
# binaries (e.g. before and after a change), alternating servers per round so
# that load drift hits both alike. Prints, per call, the server binary, N and
# the CLI's timings and throughput lines (server stage times and client wall).
#
#   bench/unary_timing.sh BUILD_DIR "N1 N2 ..." ROUNDS SERVER_BIN... [-- server flags]
set -uo pipefail
build=${1:?build dir}
sizes=${2:?sizes}
rounds=${3:?rounds}
shift 3
servers=()
while [[ $# -gt 0 && $1 != -- ]]; do servers+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
cli=$build/client/cpp/dgmm-cli
for round in $(seq 1 "$rounds"); do
  for bin in "${servers[@]}"; do
    port=$((30000 + RANDOM % 20000))
    log=$(mktemp)
    "$bin" --listen="127.0.0.1:$port" --allow_regions=false "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do grep -q "listening on" "$log" && break; sleep 0.1; done
    for n in $sizes; do
      out=$("$cli" multiply --server="127.0.0.1:$port" --random="$n" --mode=unary --check 2>&1)
      echo "round=$round server=$bin N=$n | $(grep -E '^(timings|throughput|max relative)' <<<"$out" | tr '\n' ' ')"
    done
    kill "$pid"
    wait "$pid" 2>/dev/null
    rm -f "$log"
  done
done
