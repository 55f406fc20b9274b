#!/usr/bin/env bash
# Installs what is missing (Debian packages), builds, starts dgmm-server (on
# the GPU if there is one, else the CPU; with its defaults, under which a
# client on this host takes the same-host path), runs one real job through dgmm-cli
# with a local float64 check, prints the outcome and stops the server.
#
#   ./run.sh [N]        (default N=4096)
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
n=${1:-4096}
"$root/scripts/install-deps.sh" build
BUILD_TARGETS="dgmm-server dgmm-cli" "$root/scripts/build.sh"
build=${BUILD_DIR:-$root/build}

work=$(mktemp -d)
server_pid=
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"; wait "$server_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$build/service/dgmm-server" --listen=127.0.0.1:0 --port_file="$work/port" \
  2>"$work/server.log" &
server_pid=$!
for _ in $(seq 300); do [[ -s $work/port ]] && break; sleep 0.1; done
[[ -s $work/port ]] || { echo "dgmm-server did not start:"; cat "$work/server.log"; exit 1; }
addr=127.0.0.1:$(cat "$work/port")
echo "== dgmm-server is up at $addr"
sed 's/^/   server: /' "$work/server.log"
echo "== dgmm-cli health"
"$build/client/cpp/dgmm-cli" health --server "$addr"
echo "== dgmm-cli multiply --random $n --check"
"$build/client/cpp/dgmm-cli" multiply --random "$n" --check --server "$addr"
echo "== dgmm-cli info"
"$build/client/cpp/dgmm-cli" info --server "$addr"
echo "== stopping dgmm-server"
kill -TERM "$server_pid"; wait "$server_pid"; server_pid=
sed -n '/signal/,$p' "$work/server.log" | sed 's/^/   server: /'
echo "== run.sh: OK"
