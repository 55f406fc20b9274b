#!/usr/bin/env bash
# Where an idle dgmm-server's resident memory goes: starts the server with
# the given flags, waits until it serves, then prints its /proc status lines
# (VmRSS split into anonymous, file-backed and shared memory) and the largest
# mappings by RSS from /proc/PID/smaps. Used to tell the fixed cost of the
# CUDA runtime and libraries from what dgmm allocates (bench/results/stream).
#
#   bench/rss_breakdown.sh BUILD_DIR [dgmm-server flags...]
set -uo pipefail
build=${1:?build dir}
shift
port=$((20000 + RANDOM % 20000))
"$build/service/dgmm-server" --listen="127.0.0.1:$port" --allow_regions=false "$@" >/tmp/rss_breakdown.$$.log 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  grep -q "listening on" /tmp/rss_breakdown.$$.log && break
  sleep 0.1
done
sleep 1
echo "# dgmm-server $* (pid $pid)"
grep -E '^(VmHWM|VmRSS|RssAnon|RssFile|RssShmem|VmLck|VmPin)' "/proc/$pid/status"
echo "# largest mappings by RSS (kB, path)"
awk '/^[0-9a-f]+-[0-9a-f]+ / { path = ($6 == "" ? "[anon]" : $6) }
     /^Rss:/ { rss[path] += $2 }
     END { for (p in rss) print rss[p], p }' "/proc/$pid/smaps" | sort -rn | head -12
kill "$pid"
wait "$pid" 2>/dev/null
rm -f /tmp/rss_breakdown.$$.log
