#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# `source .gpu/env.sh`: bench/ipc_bench (CUDA IPC jobs from a C++ client
# process that owns the GPU memory, next to dgmm's kernel alone) against a
# dgmm-server started here with --allow_regions. Log in $OUT (or ./gpu-out).
#
#   bench/run_gpu_ipc.sh COMMIT [BUILD_DIR] [ipc_bench flags...]
set -uo pipefail
# shellcheck source=bench/gpu_run_setup.sh
source "$(dirname "$0")/gpu_run_setup.sh"  # commit, build, out, header; shifts 2
dir=$(mktemp -d)
"$build/service/dgmm-server" --listen=127.0.0.1:0 --port_file="$dir/port" --allow_regions \
  --backend=auto > "$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 1200); do [[ -s $dir/port ]] && break; sleep 0.1; done
port=$(cat "$dir/port")
cmd="$build/bench/ipc_bench --server=127.0.0.1:$port $*"
{ header "$cmd (server: dgmm-server --allow_regions --backend=auto)"; $cmd 2>&1; echo "ipc_bench exit: $?"; } \
  > "$out/ipc_bench.log" 2>&1
kill -TERM "$server"; wait "$server"
{ echo; echo "## server log"; cat "$dir/server.log"; } >> "$out/ipc_bench.log"
cat "$out/ipc_bench.log" | head -30
rm -rf "$dir"
