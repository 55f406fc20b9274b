#!/usr/bin/env bash
# A/B on one host: one N=20000 float32 job at K = 1 and 8
# (bench/stripe_bench, warm client, median of --reps) against dgmm-servers
# started with different settings, one at a time, in one run:
#   base        the defaults
#   bdp         --http2_bdp_probe=true (gRPC grows the HTTP/2 windows)
#   epoll1      the client polls with epoll1 (GRPC_POLL_STRATEGY; the
#               client tools set "poll" unless told otherwise)
#   malloc      both sides with glibc malloc keeping freed memory
#               (GLIBC_TUNABLES mmap_threshold 64 MiB, trim_threshold 1 GiB)
#   frame       both sides accept HTTP/2 DATA frames of up to 16 MiB - 1
#               (grpc.http2.max_frame_size through DGMM_GRPC_ARGS, proto/
#               wire.h; gRPC 1.51's default is 16 KiB: 256 frames a block)
#   cbdp0       the client without BDP probing too (its receive window then
#               stays ~1 MiB, as the server's: smaller writes each way, so
#               WINDOW_UPDATEs wait less behind the other direction's data)
#   frame_cbdp0 both of the above
#   bdp_frame   bdp and frame
#   look        both sides with a 16 MiB HTTP/2 stream lookahead
#               (grpc.http2.lookahead_bytes, the window gRPC aims for)
#   chunk       both sides read the socket in chunks of 4 MiB (1-16 MiB;
#               grpc.experimental.tcp_*read_chunk_size; 1.51's default
#               starts at 8 KiB and adapts)
# Not offered: grpc.experimental.tcp_tx_zerocopy_enabled=1 -- on the 2-core
# machine (loopback) stripe_bench then spun at 176% CPU for 10 minutes
# without finishing an N=4000 job (2026-12-03).
# Prints one CSV line per (setting, K): setting,N,K,...(stripe_bench's CSV).
#
#   bench/wire_ab.sh [--build DIR] [--n N] [--reps R] [settings...]
set -uo pipefail
build=build; n=20000; reps=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) break ;;
  esac
done
settings=${*:-base bdp epoll1 malloc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for s in $settings; do
  flags=(); cenv=(); senv=()
  case $s in
    base) ;;
    bdp) flags=(--http2_bdp_probe=true) ;;
    frame) senv=(DGMM_GRPC_ARGS=grpc.http2.max_frame_size=16777215); cenv=("${senv[@]}") ;;
    cbdp0) cenv=(DGMM_GRPC_ARGS=grpc.http2.bdp_probe=0) ;;
    frame_cbdp0) senv=(DGMM_GRPC_ARGS=grpc.http2.max_frame_size=16777215)
                 cenv=(DGMM_GRPC_ARGS=grpc.http2.max_frame_size=16777215,grpc.http2.bdp_probe=0) ;;
    bdp_frame) flags=(--http2_bdp_probe=true)
               senv=(DGMM_GRPC_ARGS=grpc.http2.max_frame_size=16777215); cenv=("${senv[@]}") ;;
    look) senv=(DGMM_GRPC_ARGS=grpc.http2.lookahead_bytes=16777216); cenv=("${senv[@]}") ;;
    chunk) senv=(DGMM_GRPC_ARGS=grpc.experimental.tcp_read_chunk_size=4194304,grpc.experimental.tcp_min_read_chunk_size=1048576,grpc.experimental.tcp_max_read_chunk_size=16777216)
           cenv=("${senv[@]}") ;;
    epoll1) cenv=(GRPC_POLL_STRATEGY=epoll1) ;;
    malloc) senv=(GLIBC_TUNABLES=glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=1073741824)
            cenv=("${senv[@]}") ;;
    *) echo "unknown setting $s" >&2; continue ;;
  esac
  rm -f "$tmp/port"
  env "${senv[@]}" "$build/service/dgmm-server" --listen=127.0.0.1:0 --port_file="$tmp/port" \
    --backend=auto --allow_regions=false "${flags[@]}" > "$tmp/server_$s.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [[ -s $tmp/port ]] && break; sleep 0.1; done
  port=$(cat "$tmp/port")
  env "${cenv[@]}" "$build/bench/stripe_bench" --target=127.0.0.1:$port --sizes=$n \
    --stripes=1,8 --reps=$reps --check=false 2>/dev/null | grep "^$n," | sed "s/^/$s,/"
  kill "$pid"; wait "$pid" 2>/dev/null
done
