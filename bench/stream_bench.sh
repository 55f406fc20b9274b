#!/usr/bin/env bash
# End-to-end streaming benchmark over loopback: for each N,
# a dgmm multiply and an echo of the same bytes through the same streaming RPC
# shape (one MultiplyStream, one connection), against the raw TCP loopback
# bandwidth of one connection measured in the same run, one way and both ways
# (one iperf3 server+client pair, plain and --bidir, before and after the
# gRPC runs: bench/loopback_ceiling.sh with K = 1); then the
# server's peak RSS during one streamed N=40000 job. Prints a Markdown table
# with every target MET or MISSED and writes it, the raw CSV and the log to
# the output folder.
#
#   bench/stream_bench.sh [options] [-- extra dgmm-server flags]
#     --build DIR      build tree with service/dgmm-server and bench/stream_bench
#                      (default build-stream)
#     --backend B      dgmm-server --backend (default auto: the GPU if any)
#     --sizes LIST     N values (default 1000,4000,10000,20000)
#     --reps R         calls per N and mode, median reported (default 3)
#     --rss_n N        N of the memory check (default 40000; 0 skips it)
#     --tcp_seconds S  length of each iperf3 test (default 5)
#     --copy_n N       N of the copy count (default 10000; 0 skips it): one
#                      multiply and one echo against a second server run under
#                      bench/stream_bench_copycount.cc's LD_PRELOAD shim, which
#                      counts the bytes the server copies with memcpy/memmove
#     --out DIR        where results go (default $OUT, else $build/bench-out/stream; file a
#                      run worth keeping as bench/results/stream/<machine>_<commit>/)
#     --commit SHA     commit to record (default: git rev-parse HEAD, with +dirty)
#
# iperf3 is looked up in PATH, then next to stream_bench (the bench's CMake
# copies this machine's iperf3 there, so a packed build tree carries it to a
# machine that cannot install it). Without it the TCP ceiling is measured
# with a Python socket pair instead, and the table says so.
#
# Targets: multiply <= 1.15 x echo and in+out >= 50% of one connection one way
# (N >= 4000); one stream >= 0.8 x one TCP connection both ways at
# the largest N (>= 3.2 GB/s in+out on the H200 host); server peak
# RSS <= 512 MiB for the N = --rss_n job.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
command_line="bench/stream_bench.sh $*"
build=build-stream
backend=auto
sizes=1000,4000,10000,20000
reps=3
rss_n=40000
tcp_seconds=5
copy_n=10000
out=${OUT:-}
commit=
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rss_n) rss_n=$2; shift 2 ;;
    --tcp_seconds) tcp_seconds=$2; shift 2 ;;
    --copy_n) copy_n=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "stream_bench.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
server_flags=("$@")
cd "$root"
out=${out:-${OUT:-$build/bench-out/stream}}
mkdir -p "$out"
server_bin=$build/service/dgmm-server
bench_bin=$build/bench/stream_bench
for b in "$server_bin" "$bench_bin"; do
  [[ -x $b ]] || { echo "stream_bench.sh: $b not built (cmake --build $build --target dgmm-server stream_bench)" >&2; exit 2; }
done
if [[ -z $commit ]]; then
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && commit="$commit+dirty"
fi

tmp=$(mktemp -d)
server_pid=
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

log=$out/stream_bench.log
: > "$log"
say() { echo "$*" | tee -a "$log" >&2; }

# ---------------------------------------------------------------- machine
cpu_model=$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)
mem_gib=$(awk '/^MemTotal/{printf "%.0f", $2/1048576}' /proc/meminfo)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "machine=$(nproc) cores ($cpu_model), ${mem_gib} GiB${gpu:+, GPU: $gpu}"
  echo "load=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit=$commit"
  echo "command=$command_line"
  echo "server_flags=--backend=$backend --enable_bench_echo ${server_flags[*]}"
} > "$tmp/meta"
cat "$tmp/meta" | tee -a "$log" >&2

# ---------------------------------------------------------- TCP ceiling
iperf=$(command -v iperf3 || true)
[[ -z $iperf && -x $build/bench/iperf3 ]] && iperf=$build/bench/iperf3
if [[ -n $iperf ]] && ! "$iperf" --version >/dev/null 2>&1; then
  say "iperf3 at $iperf does not run here (missing libraries?); falling back"
  iperf=
fi
iperf_rate() {  # $1: uni or bidir; prints GB/s received (both ways summed for bidir)
  bench/loopback_ceiling.sh "$iperf" 1 "$1" "$tcp_seconds" 2>>"$log"
}
python_rate() {  # $1: "uni" or "bidir"; prints GB/s received
  python3 - "$1" "$tcp_seconds" <<'PY'
import socket, sys, threading, time
mode, seconds = sys.argv[1], float(sys.argv[2])
chunk = 1 << 20
def pair():
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    c = socket.create_connection(srv.getsockname()); s, _ = srv.accept(); srv.close()
    return c, s
def send(sock, stop):
    buf = b"\0" * chunk
    while not stop.is_set():
        sock.sendall(buf)
    sock.shutdown(socket.SHUT_WR)
def recv(sock, total):
    buf = bytearray(chunk); view = memoryview(buf); n = 0
    while True:
        k = sock.recv_into(view)
        if k == 0: break
        n += k
    total.append(n)
stop, totals, threads = threading.Event(), [], []
for _ in range(2 if mode == "bidir" else 1):
    c, s = pair()
    threads += [threading.Thread(target=send, args=(c, stop)), threading.Thread(target=recv, args=(s, totals))]
t0 = time.time()
for t in threads: t.start()
time.sleep(seconds); stop.set()
for t in threads: t.join()
print(f"{sum(totals) / (time.time() - t0) / 1e9:.3f}")
PY
}
measure_tcp() {  # $1: label; appends label, tool, uni, bidir (tab-separated) to $tmp/tcp
  local uni bidir tool
  if [[ -n $iperf ]]; then
    tool="iperf3, one server+client pair (one connection; --bidir: one each way), loopback"
    uni=$(iperf_rate uni) || uni=
    bidir=$(iperf_rate bidir) || bidir=
  fi
  if [[ -z ${uni:-} ]]; then
    tool="python3 socket pair (iperf3 not available; not comparable with iperf3 figures)"
    uni=$(python_rate uni)
    bidir=$(python_rate bidir)
  fi
  printf '%s\t%s\t%s\t%s\n' "$1" "$tool" "$uni" "$bidir" >> "$tmp/tcp"
  say "TCP loopback ($1): $uni GB/s one way, $bidir GB/s both ways together [$tool]"
}
: > "$tmp/tcp"
if [[ -z $iperf ]]; then
  say "iperf3 not found (PATH or $build/bench/iperf3): measuring the TCP ceiling with Python sockets"
fi
measure_tcp before

# ----------------------------------------------------------------- server
start_server() {  # sets server_pid and target; extra environment as arguments (NAME=VALUE)
  rm -f "$tmp/port"
  env "$@" "$server_bin" --listen=127.0.0.1:0 --port_file="$tmp/port" --backend="$backend" \
    --enable_bench_echo --allow_regions=false "${server_flags[@]}" >> "$tmp/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 300); do [[ -s $tmp/port ]] && break; sleep 0.1; done
  [[ -s $tmp/port ]] || { cat "$tmp/server.log" >&2; echo "stream_bench.sh: the server did not start" >&2; exit 1; }
  target=127.0.0.1:$(cat "$tmp/port")
  say "dgmm-server pid $server_pid at $target"
}
stop_server() {
  kill "$server_pid" && wait "$server_pid"
  server_pid=
}
start_server

hwm_reset() { echo 5 > "/proc/$server_pid/clear_refs" 2>/dev/null || say "cannot reset VmHWM; peaks are since server start"; }
hwm_kib() { awk '/^VmHWM/{print $2}' "/proc/$server_pid/status"; }

failed=0
echo "mode,n,bytes_each_way,block_bytes,wall_s,server_total_s,backend,device,bad_blocks" > "$tmp/runs.csv"
echo "n,phase,server_peak_rss_kib" > "$tmp/rss.csv"
IFS=, read -ra size_list <<< "$sizes"
for n in "${size_list[@]}"; do
  hwm_reset
  "$bench_bin" --target="$target" --sizes="$n" --reps="$reps" --header=false \
    >> "$tmp/runs.csv" 2>> "$log" || { failed=1; say "stream_bench failed for N=$n"; }
  echo "$n,sweep,$(hwm_kib)" >> "$tmp/rss.csv"
  say "N=$n done; server VmHWM $(hwm_kib) KiB"
done
if [[ $rss_n -gt 0 ]]; then
  hwm_reset
  "$bench_bin" --target="$target" --sizes="$rss_n" --modes=multiply --reps=1 --warmup=false \
    --header=false >> "$tmp/runs.csv" 2>> "$log" || { failed=1; say "stream_bench failed for N=$rss_n"; }
  echo "$rss_n,rss_check,$(hwm_kib)" >> "$tmp/rss.csv"
  say "N=$rss_n multiply done; server VmHWM $(hwm_kib) KiB"
fi
stop_server

# Copies: the server's memcpy/memmove bytes for one call of each mode.
shim=$build/bench/libstream_bench_copycount.so
echo "mode,n,bytes_each_way,copied_bytes,copied_bytes_large" > "$tmp/copies.csv"
if [[ $copy_n -gt 0 && -f $shim ]]; then
  for mode in multiply echo; do
    : > "$tmp/copycount.txt"
    start_server DGMM_COPYCOUNT_OUT="$tmp/copycount.txt" LD_PRELOAD="$(realpath "$shim")"
    "$bench_bin" --target="$target" --sizes="$copy_n" --modes="$mode" --reps=1 --warmup=false \
      --header=false > /dev/null 2>> "$log" || { failed=1; say "copy count: $mode failed"; }
    stop_server
    read -r all large < <(sed -n 's/.*large_bytes=\([0-9]*\).*all_bytes=\([0-9]*\).*/\2 \1/p' "$tmp/copycount.txt")
    echo "$mode,$copy_n,$((4 * copy_n * copy_n)),${all:-},${large:-}" >> "$tmp/copies.csv"
    say "copy count ($mode, N=$copy_n): server copied ${all:-?} bytes (${large:-?} in copies of 64 KiB or more)"
  done
elif [[ $copy_n -gt 0 ]]; then
  say "no $shim: copy count skipped (cmake --build $build --target stream_bench_copycount)"
fi
cat "$tmp/server.log" >> "$log"

measure_tcp after
cp "$tmp/runs.csv" "$out/stream_bench.csv"
cp "$tmp/rss.csv" "$out/stream_bench_rss.csv"
cp "$tmp/copies.csv" "$out/stream_bench_copies.csv"

# ------------------------------------------------------------------ table
python3 - "$tmp/meta" "$tmp/tcp" "$tmp/runs.csv" "$tmp/rss.csv" "$rss_n" "$tmp/copies.csv" > "$out/stream_bench.md" <<'PY'
import csv, statistics, sys
meta = dict(l.rstrip("\n").split("=", 1) for l in open(sys.argv[1]) if "=" in l)
tcp = [l.rstrip("\n").split("\t") for l in open(sys.argv[2]) if l.strip()]
runs = list(csv.DictReader(open(sys.argv[3])))
rss = list(csv.DictReader(open(sys.argv[4])))
rss_n = int(sys.argv[5])
RATIO_MAX, SHARE_MIN, RSS_MAX_MIB, RATIO_FROM_N = 1.15, 0.50, 512, 4000
ONE_STREAM_MIN = 0.8  # one stream >= 0.8 x one TCP connection both ways

def verdict(ok): return "MET" if ok else "MISSED"
def walls(mode, n): return [float(r["wall_s"]) for r in runs if r["mode"] == mode and int(r["n"]) == n]
def wall(mode, n):
    w = walls(mode, n)
    return statistics.median(w) if w else None
def paired_ratio(n):
    # Calls alternate echo, multiply within each repetition: pairing them
    # cancels the drift of a shared machine's load better than a ratio of
    # medians does.
    e, m = walls("echo", n), walls("multiply", n)
    k = min(len(e), len(m))
    return statistics.median(m[i] / e[i] for i in range(k)) if k else None

rates = [float(t[2]) for t in tcp if t[2]]
ceiling = max(rates) if rates else None
bidir_rates = [float(t[3]) for t in tcp if t[3]]
ceiling_bidir = max(bidir_rates) if bidir_rates else None
tool = tcp[0][1] if tcp else "none"
print(f"# Streaming end to end over loopback\n")
for k in ("date", "machine", "load", "commit", "command", "server_flags"):
    print(f"- {k}: `{meta.get(k, '')}`")
print(f"- backend that ran the multiplies: {', '.join(sorted({r['backend'] + ' on ' + r['device'] for r in runs if r['mode'] == 'multiply'})) or 'none'}")
print(f"- every returned block compared with the expected bytes: {sum(int(r['bad_blocks']) for r in runs)} wrong blocks")
print(f"- TCP loopback ceiling: {tool}")
for t in tcp:
    print(f"  - {t[0]} the gRPC runs: {t[2] or '?'} GB/s one way, {t[3] or '?'} GB/s both ways together")
print(f"  - ceilings used below: the larger one-way figure, {ceiling if ceiling else 'n/a'} GB/s, "
      f"and the larger both-ways figure, {ceiling_bidir if ceiling_bidir else 'n/a'} GB/s\n")

print("| N | MB each way | echo s | multiply s | multiply / echo | ≤ 1.15 (N ≥ 4000) | best / best | in+out GB/s | share of TCP one way | ≥ 50% (N ≥ 4000) | share of TCP both ways | server peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
worst_ratio, worst_share = None, None
ns = sorted({int(r["n"]) for r in runs if r["mode"] == "echo"})
for n in ns:
    e, m = wall("echo", n), wall("multiply", n)
    nbytes = 4 * n * n
    ratio = paired_ratio(n)
    best = min(walls("multiply", n)) / min(walls("echo", n)) if e and m else None
    gbps = 2 * nbytes / m / 1e9 if m else None
    share = gbps / ceiling if gbps and ceiling else None
    share_bidir = gbps / ceiling_bidir if gbps and ceiling_bidir else None
    peak = next((int(r["server_peak_rss_kib"]) / 1024 for r in rss if int(r["n"]) == n and r["phase"] == "sweep"), None)
    gated = n >= RATIO_FROM_N
    if gated and ratio is not None and (worst_ratio is None or ratio > worst_ratio[0]): worst_ratio = (ratio, n, m, e)
    if gated and share is not None and (worst_share is None or share < worst_share[0]): worst_share = (share, n, gbps)
    f = lambda x, p=3: "n/a" if x is None else f"{x:.{p}f}"
    print(f"| {n} | {nbytes / 1e6:.0f} | {f(e)} | {f(m)} | {f(ratio)} | {verdict(ratio <= RATIO_MAX) if gated and ratio else '—'} | {f(best)} "
          f"| {f(gbps)} | {f(share)} | {verdict(share >= SHARE_MIN) if gated and share else '—'} | {f(share_bidir)} | {f(peak, 0)} |")
print()
print("Times: median of the calls' wall time on the client (header to final status). multiply / echo:")
print("median over repetitions of the ratio of each multiply to the echo just before it; best / best:")
print("fastest multiply over fastest echo. in+out GB/s = 2 × bytes each way / median multiply time.")
print("Server peak RSS: VmHWM, reset before each N (echo and multiply calls of that N together).\n")

print("| target | measured | ratio | verdict |\n|---|---|---|---|")
if worst_ratio:
    r, n, m, e = worst_ratio
    print(f"| multiply ≤ 1.15 × echo, N ≥ 4000 (paired median) | worst N={n}: medians {m:.3f} s vs {e:.3f} s | {r:.3f} | {verdict(r <= RATIO_MAX)} |")
else:
    print("| multiply ≤ 1.15 × echo, N ≥ 4000 | no run with N ≥ 4000 | | n/a |")
if worst_share:
    s, n, g = worst_share
    print(f"| in+out throughput ≥ 50% of TCP loopback, N ≥ 4000 | worst N={n}: {g:.3f} vs {ceiling:.3f} GB/s | {s:.3f} | {verdict(s >= SHARE_MIN)} |")
else:
    why = "no run with N ≥ 4000" if ceiling else "TCP ceiling not measured"
    print(f"| in+out throughput ≥ 50% of TCP loopback, N ≥ 4000 | {why} | | n/a |")
n_top = max(ns) if ns else None
m_top = wall("multiply", n_top) if n_top else None
if m_top and ceiling_bidir:
    g = 2 * 4 * n_top * n_top / m_top / 1e9
    r = g / ceiling_bidir
    note = "" if "GPU" in meta.get("machine", "") else " (no GPU here: the target is the H200 host's, recorded for the ratio)"
    print(f"| one stream ≥ 0.8 × one TCP connection both ways, N={n_top} | {g:.3f} vs {ceiling_bidir:.3f} GB/s | {r:.3f} | {verdict(r >= ONE_STREAM_MIN)}{note} |")
else:
    print("| one stream ≥ 0.8 × one TCP connection both ways | not measured | | n/a |")
chk = next((r for r in rss if r["phase"] == "rss_check"), None)
if chk:
    mib = int(chk["server_peak_rss_kib"]) / 1024
    m = wall("multiply", rss_n)
    extra = f", job {m:.2f} s, {2 * 4 * rss_n * rss_n / m / 1e9:.3f} GB/s in+out" if m else ", job failed"
    print(f"| server peak RSS ≤ 512 MiB, streamed N={rss_n} float32 ({4 * rss_n * rss_n / 1e9:.1f} GB each way) | {mib:.0f} MiB{extra} | {mib / RSS_MAX_MIB:.3f} | {verdict(mib <= RSS_MAX_MIB and m is not None)} |")
copies = [r for r in csv.DictReader(open(sys.argv[6])) if r["copied_bytes"]]
if copies:
    print("\nServer-side user-space copies (memcpy/memmove bytes counted by bench/stream_bench_copycount.cc,")
    print("one call on a fresh server; kernel socket copies and DMA not included):\n")
    print("| mode | N | bytes each way | bytes copied | copies per payload byte (in + out) | of which in copies ≥ 64 KiB |")
    print("|---|---|---|---|---|---|")
    for r in copies:
        b = int(r["bytes_each_way"])
        print(f"| {r['mode']} | {r['n']} | {b} | {r['copied_bytes']} | {int(r['copied_bytes']) / b:.2f} | {int(r['copied_bytes_large']) / b:.2f} |")
PY
cat "$out/stream_bench.md"
exit $failed
