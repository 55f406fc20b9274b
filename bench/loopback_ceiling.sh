#!/usr/bin/env bash
# The loopback's TCP capacity for K connections: K separate iperf3
# server+client process pairs on K ports, all clients started at once, their
# rates summed. One iperf3 3.12 process is single-threaded, so `iperf3 -P K`
# stops near one core's worth (about 5 GB/s on the H200 host) and is not a
# ceiling; K processes are.
#
#   bench/loopback_ceiling.sh IPERF3 K uni|bidir SECONDS [LOGDIR]
#
# uni: each client sends to its server (one way). bidir: each pair runs
# `--bidir` (one connection each way per pair, both moving at once), and the
# figure is both directions summed. Prints the sum in GB/s (10^9 bytes/s,
# bytes received) on stdout, one line; the per-pair figures go to stderr.
# Exit status 1 (nothing on stdout) when a pair failed: a port in use, a
# client that could not connect, or a process that did not finish.
set -uo pipefail
iperf=${1:?iperf3 binary}
k=${2:?K}
mode=${3:?uni or bidir}
seconds=${4:?seconds}
logdir=${5:-}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
flags=()
[[ $mode == bidir ]] && flags=(--bidir)

for attempt in 1 2 3; do
  base=$(( 20000 + RANDOM % 30000 ))
  pids=()
  for (( i = 0; i < k; i++ )); do
    # -1: the server handles one client and exits.
    "$iperf" -s -1 -p $(( base + i )) > "$tmp/server$i.log" 2>&1 &
    pids+=($!)
  done
  sleep 0.5
  alive=1
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || alive=0; done
  [[ $alive == 1 ]] && break
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  echo "loopback_ceiling: an iperf3 server did not start on ports $base.. (in use?), retrying" >&2
done
[[ $alive == 1 ]] || exit 1

cpids=()
for (( i = 0; i < k; i++ )); do
  "$iperf" -c 127.0.0.1 -p $(( base + i )) -t "$seconds" -J "${flags[@]}" \
    > "$tmp/client$i.json" 2> "$tmp/client$i.err" &
  cpids+=($!)
done
failed=0
for p in "${cpids[@]}"; do wait "$p" || failed=1; done
# The servers exit after their one client; give them a moment, then stop them.
for p in "${pids[@]}"; do
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill "$p" 2>/dev/null
done
if [[ -n $logdir ]]; then
  mkdir -p "$logdir"
  for (( i = 0; i < k; i++ )); do cp "$tmp/client$i.json" "$logdir/iperf3-k$k-$mode-$i.json" 2>/dev/null; done
fi
[[ $failed == 0 ]] || { cat "$tmp"/client*.err >&2; exit 1; }
python3 - "$k" "$mode" "$tmp" <<'PY'
import json, sys
k, mode, tmp = int(sys.argv[1]), sys.argv[2], sys.argv[3]
total, parts = 0.0, []
for i in range(k):
    end = json.load(open(f"{tmp}/client{i}.json"))["end"]
    fwd = end["sum_received"]["bits_per_second"] / 8e9
    rev = end.get("sum_received_bidir_reverse", {}).get("bits_per_second", 0) / 8e9
    total += fwd + rev
    parts.append(f"{fwd:.3f}+{rev:.3f}" if mode == "bidir" else f"{fwd:.3f}")
print(f"loopback_ceiling: K={k} {mode}: pairs {' '.join(parts)} GB/s, sum {total:.3f}", file=sys.stderr)
print(f"{total:.3f}")
PY
