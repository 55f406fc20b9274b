#!/usr/bin/env bash
# Instructions a dgmm-server executes per 1x1 job, counted by valgrind's
# callgrind: a figure that other processes on the machine do not disturb,
# unlike the job rate (bench/metrics/metrics_ab.py). For each server binary
# given, in turns: start it under callgrind (CPU backend, --metrics_listen
# on, no scrape), zero the counters once it listens, run
# bench/small_job_bench --loop_1x1_seconds=SECONDS against it, dump, and
# print the jobs, the instructions per job over the whole process, and per
# job inside JobMetrics::Ended and Admission::RecordOutcome (inclusive).
# Threads run one at a time under valgrind, so the whole-process figure
# still moves with how often absl::Mutex spins; the per-function figures
# are exact.
#
#   bench/metrics/instructions_per_job.sh [--seconds S] [--turns T] SERVER_A SERVER_B
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=8
turns=2
client=$root/build/bench/small_job_bench
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --turns) turns=$2; shift 2 ;;
    --client) client=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
(($# >= 1)) || { echo "usage: $0 [--seconds S] [--turns T] [--client BIN] SERVER..." >&2; exit 2; }
command -v valgrind > /dev/null || { echo "valgrind is not installed" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

one() {  # SERVER LABEL
  local dir=$work/$2 pid n ir ended outcome
  rm -rf "$dir"; mkdir -p "$dir"
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" "$1" --backend=cpu \
    --listen=127.0.0.1:0 --port_file="$dir/port" --metrics_listen=127.0.0.1:0 \
    --allow_regions=false --threads=2 > "$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do [[ -s $dir/port ]] && break; sleep 0.1; done
  [[ -s $dir/port ]] || { cat "$dir/log"; exit 1; }
  sleep 1
  callgrind_control -z "$pid" > /dev/null 2>&1
  "$client" --server="127.0.0.1:$(cat "$dir/port")" --loop_1x1_seconds="$seconds" > "$dir/client"
  callgrind_control -d "$pid" > /dev/null 2>&1
  kill -TERM "$pid"; wait "$pid" || true
  n=$(grep -o 'one thread: [0-9]*' "$dir/client" | grep -o '[0-9]*$')
  local f; f=$(ls "$dir"/cg.*.1)
  ir=$(grep '^summary:' "$f" | awk '{print $2}')
  callgrind_annotate --inclusive=yes --threshold=100 "$f" > "$dir/annotate" 2> /dev/null
  ended=$(grep 'JobMetrics::Ended' "$dir/annotate" | head -1 | awk '{gsub(",", "", $1); print $1}')
  outcome=$(grep 'Admission::RecordOutcome' "$dir/annotate" | head -1 | awk '{gsub(",", "", $1); print $1}')
  printf '| %s | %d | %d | %.1f | %.1f |\n' "$2" "$n" $((ir / n)) \
    "$(echo "${ended:-0} / $n" | bc -l)" "$(echo "${outcome:-0} / $n" | bc -l)"
}

echo "date: $(date -u +%FT%TZ); $(nproc) cpus; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "client: $client --loop_1x1_seconds=$seconds, under callgrind: the servers"

for ((i = 1; i <= $#; i++)); do echo "server $i: ${!i}"; done
echo "| server | jobs | instructions / job | in JobMetrics::Ended | in Admission::RecordOutcome |"
echo "|---|---|---|---|---|"
for ((t = 0; t < turns; t++)); do
  for ((i = 1; i <= $#; i++)); do one "${!i}" "$i"; done
done
