#!/usr/bin/env bash
# Striping benchmark: one float32 job at N = 10000 and
# 20000 with K = 1, 2, 4, 8 and the client's auto K, against the loopback's
# TCP capacity for the same K measured in the same run: K separate iperf3
# server+client pairs started at once (bench/loopback_ceiling.sh), one way and
# --bidir, summed (one iperf3 3.12 process is single-threaded, so
# `iperf3 -P K` is not a ceiling). Then small N with the default (auto) K
# against one stream, and `dgmm-cli multiply --random=N --stripes=K` (its RPC,
# as the CLI reports it) against this bench's figure for the same job.
# K = 1 is the unstriped job: one MultiplyStream on one connection. Starts
# one dgmm-server, runs bench/stripe_bench (the C++ client), prints a
# Markdown table with each job's GB/s in+out and its share of the --bidir
# ceiling at its K, and the targets MET or MISSED with their ratio;
# writes it, the CSVs and the log to the output folder.
#
#   bench/stripe_bench.sh [options] [-- extra dgmm-server flags]
#     --build DIR      build tree with service/dgmm-server, bench/stripe_bench
#                      and client/cpp/dgmm-cli (default build)
#     --backend B      dgmm-server --backend (default auto: the GPU if any)
#     --sizes LIST     large N values (default 10000,20000)
#     --small LIST     small N values for "never slower than one stream"
#                      (default 1000,2000; "" skips them)
#     --stripes LIST   K values (default 1,2,4,8; auto is always added)
#     --reps R         timed jobs per (N, K), median reported (default 3)
#     --tcp_seconds S  length of each iperf3 run (default 3)
#     --cli_stripes L  K values of the dgmm-cli rows, at the largest N
#                      (default 1,8; "" skips dgmm-cli)
#     --cli_reps R     dgmm-cli runs per K, median reported (default 3)
#     --out DIR        where results go (default $OUT, else $build/bench-out/stripe; file a
#                      run worth keeping as bench/results/stripe/<machine>_<commit>/)
#     --commit SHA     commit to record (default: git rev-parse HEAD, +dirty)
#
# Needs python3 (the table) and iperf3: from PATH, else $build/bench/iperf3
# (bench/CMakeLists.txt copies this machine's there; it loads libiperf.so.0,
# libsctp.so.1 and libcrypto.so.3, which bench/gpu/run.sh pack carries
# with a packed tree). Without a working iperf3 the ceiling columns say n/a.
#
# Time: the ceiling takes 2 x (number of K) x (S + ~1) s (about 35 s with the
# defaults); each dgmm-cli run makes its random N x N matrix on one thread
# first (about 3 s at N = 20000).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
command_line="bench/stripe_bench.sh $*"
build=build
backend=auto
sizes=10000,20000
small=1000,2000
stripes=1,2,4,8
reps=3
tcp_seconds=3
cli_stripes=1,8
cli_reps=3
out=${OUT:-}
commit=
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --small) small=$2; shift 2 ;;
    --stripes) stripes=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --tcp_seconds) tcp_seconds=$2; shift 2 ;;
    --cli_stripes) cli_stripes=$2; shift 2 ;;
    --cli_reps) cli_reps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "stripe_bench.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
server_flags=("$@")
cd "$root"
out=${out:-${OUT:-$build/bench-out/stripe}}
mkdir -p "$out"
server_bin=$build/service/dgmm-server
bench_bin=$build/bench/stripe_bench
cli_bin=$build/client/cpp/dgmm-cli
for b in "$server_bin" "$bench_bin"; do
  [[ -x $b ]] || { echo "stripe_bench.sh: $b not built (cmake --build $build --target dgmm-server stripe_bench dgmm-cli)" >&2; exit 2; }
done
if [[ -n $cli_stripes && ! -x $cli_bin ]]; then
  echo "stripe_bench.sh: $cli_bin not built: dgmm-cli rows skipped" >&2
  cli_stripes=
fi
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
log=$out/stripe_bench.log
: > "$log"
say() { echo "$*" | tee -a "$log" >&2; }

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "machine=$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(awk '/MemTotal/ {printf "%d GiB", $2/1048576}' /proc/meminfo)${gpu:+, GPU $gpu}"
  echo "load=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit=$commit"
  echo "command=$command_line"
  echo "server_flags=--backend=$backend ${server_flags[*]:-}"
} > "$tmp/meta"
cat "$tmp/meta" | tee -a "$log" >&2

# ---------------------------------------------------------- the loopback's ceiling
# K separate iperf3 pairs, started at once, summed (bench/loopback_ceiling.sh).
iperf=$(command -v iperf3 || true)
[[ -z $iperf && -x $build/bench/iperf3 ]] && iperf=$build/bench/iperf3
if [[ -n $iperf ]] && ! "$iperf" --version >/dev/null 2>&1; then
  say "iperf3 at $iperf does not run here (missing libraries?); ceiling columns n/a"
  iperf=
fi
echo "k,how,gbps" > "$tmp/iperf.csv"
if [[ -n $iperf ]]; then
  for k in ${stripes//,/ }; do
    for how in uni bidir; do
      rate=$(bench/loopback_ceiling.sh "$iperf" "$k" "$how" "$tcp_seconds" 2>>"$log") || {
        say "loopback ceiling K=$k $how failed (see the log)"; continue; }
      echo "$k,$how,$rate" >> "$tmp/iperf.csv"
      say "loopback ceiling, $k iperf3 pair(s)${how/uni/ one way}${how/bidir/ --bidir}, ${tcp_seconds}s: $rate GB/s"
    done
  done
else
  say "no iperf3 (PATH or $build/bench/iperf3): ceiling columns n/a"
fi
cp "$tmp/iperf.csv" "$out/iperf3.csv"

# ---------------------------------------------------------- the server and the jobs
"$server_bin" --listen=127.0.0.1:0 --port_file="$tmp/port" --backend="$backend" --allow_regions=false "${server_flags[@]}" \
  > "$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 300); do [[ -s $tmp/port ]] && break; sleep 0.1; done
[[ -s $tmp/port ]] || { cat "$tmp/server.log" >&2; echo "stripe_bench.sh: server did not start" >&2; exit 1; }
target=127.0.0.1:$(cat "$tmp/port")
say "server at $target"
"$bench_bin" --target="$target" --sizes="$sizes" --stripes="$stripes,0" --reps="$reps" \
  > "$out/stripe_bench.csv" 2>>"$log" || { say "stripe_bench failed"; exit 1; }
if [[ -n $small ]]; then
  "$bench_bin" --target="$target" --sizes="$small" --stripes="1,0,2" --reps="$(( reps * 3 ))" \
    2>>"$log" | tail -n +2 >> "$out/stripe_bench.csv" || { say "stripe_bench (small N) failed"; exit 1; }
fi
cat "$out/stripe_bench.csv" >> "$log"

# ---------------------------------------------------------- dgmm-cli, the same jobs
# `dgmm-cli multiply --random=N --stripes=K`: its RPC time is the "ms wall
# (client)" it prints (Client::Multiply in a new process; since 2026-12-02
# dgmm-cli opens the job's connections and touches the output array's pages
# while it makes A, before the RPC); the process's own wall time is recorded
# beside it.
# --shm=off: the socket, as the bench (this server has --allow_regions=false).
echo "n,k_option,k_used,mode,rep,rpc_s,gbps_in_out,process_s" > "$out/dgmm_cli.csv"
n_cli=${sizes##*,}
for k in ${cli_stripes//,/ }; do
  for (( i = 1; i <= cli_reps; i++ )); do
    t0=$(date +%s%N)
    "$cli_bin" multiply --server="$target" --random="$n_cli" --stripes="$k" --shm=off \
      > "$tmp/cli.txt" 2>&1 || { say "dgmm-cli N=$n_cli K=$k failed: $(tail -1 "$tmp/cli.txt")"; continue; }
    t1=$(date +%s%N)
    cat "$tmp/cli.txt" >> "$log"
    python3 - "$tmp/cli.txt" "$n_cli" "$k" "$i" "$(( (t1 - t0) / 1000 ))" >> "$out/dgmm_cli.csv" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
n, k, rep, process_us = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
wall = float(re.search(r"([0-9.]+) ms wall \(client\)", text).group(1)) / 1e3
gbps = float(re.search(r"throughput: ([0-9.]+) GB/s", text).group(1))
m = re.search(r"mode: +(\w+), (\d+) stripe", text)
print(f"{n},{k},{m.group(2)},{m.group(1)},{rep},{wall:.4f},{gbps:.3f},{process_us / 1e6:.3f}")
PY
    say "dgmm-cli N=$n_cli --stripes=$k run $i: $(tail -1 "$out/dgmm_cli.csv")"
  done
done
grep -E 'dgmm: (device|jobs run)' "$tmp/server.log" >> "$log"

# ---------------------------------------------------------- the table
python3 - "$tmp/meta" "$out/stripe_bench.csv" "$out/iperf3.csv" "$sizes" "$small" "$out/dgmm_cli.csv" "$tcp_seconds" \
  > "$out/stripe_bench.md" <<'PY'
import csv, statistics, sys
meta = dict(line.rstrip("\n").split("=", 1) for line in open(sys.argv[1]) if "=" in line)
rows = list(csv.DictReader(open(sys.argv[2])))
iperf = {(int(r["k"]), r["how"]): float(r["gbps"]) for r in csv.DictReader(open(sys.argv[3]))}
large = [int(x) for x in sys.argv[4].split(",") if x]
small = [int(x) for x in sys.argv[5].split(",") if x]
cli = list(csv.DictReader(open(sys.argv[6])))
tcp_seconds = sys.argv[7]
SHARE_MIN, ONE_STREAM_MIN, CLI_MIN = 0.5, 0.8, 0.9

def fmt(x, f="{:.3f}"):
    return "n/a" if x is None else f.format(x)
def verdict(ok):
    return "MET" if ok else "MISSED"

print("# Striped jobs over loopback\n")
for key in ("date", "machine", "load", "commit", "command", "server_flags"):
    print(f"- {key}: `{meta.get(key, '')}`")
print("- client: bench/stripe_bench (dgmm::Client, ClientOptions.stripes = K; 0 = auto), "
      "float32 N x N row-major, side right; K = 1 is the unstriped job (one MultiplyStream on one connection)")
print("- GB/s in+out = 2 x matrix bytes / median wall time of Client::Multiply")
print(f"- loopback ceiling at K (bench/loopback_ceiling.sh): K separate iperf3 server+client pairs on K ports, "
      f"started at once, {tcp_seconds} s, bytes received summed; one way (each client sends), and --bidir "
      f"(each pair one connection each way, both directions summed). Share = job's GB/s in+out / the --bidir "
      f"ceiling at the K it used\n")
print("| N | K asked | K used | mode | median s | best s | GB/s in+out | ceiling one way GB/s | ceiling --bidir GB/s | share of --bidir | attempts | checked |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    n, kopt, k = int(r["n"]), int(r["k_option"]), int(r["k_used"])
    uni, bidir = iperf.get((k, "uni")), iperf.get((k, "bidir"))
    g = float(r["gbps_in_out"])
    print(f"| {n} | {'auto' if kopt == 0 else kopt} | {k} | {r['mode']} | {r['median_s']} | {r['best_s']} | "
          f"{g:.3f} | {fmt(uni)} | {fmt(bidir)} | {fmt(g / bidir if bidir else None, '{:.2f}')} | {r['attempts']} | {r['checked']} |")
by = {(int(r["n"]), int(r["k_option"])): r for r in rows}

cli_med = {}
if cli:
    print("\n`dgmm-cli multiply --random=N --stripes=K --shm=off` against the same server, each run a fresh process "
          "(RPC: the CLI's own \"ms wall (client)\", Client::Multiply in a new process, "
          "its connections opened and C's pages touched while it made A; process: the whole command, random matrix included):\n")
    print("| N | --stripes | K used | mode | runs | RPC median s | GB/s in+out (CLI) | process median s | bench GB/s, same N and K | CLI / bench |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kopt in sorted({int(r["k_option"]) for r in cli}):
        rs = [r for r in cli if int(r["k_option"]) == kopt]
        n = int(rs[0]["n"])
        g = statistics.median(float(r["gbps_in_out"]) for r in rs)
        b = by.get((n, kopt))
        ratio = g / float(b["gbps_in_out"]) if b else None
        cli_med[(n, kopt)] = (g, b, ratio, rs[0]["k_used"])
        print(f"| {n} | {'auto' if kopt == 0 else kopt} | {rs[0]['k_used']} | {rs[0]['mode']} | {len(rs)} | "
              f"{statistics.median(float(r['rpc_s']) for r in rs):.4f} | {g:.3f} | "
              f"{statistics.median(float(r['process_s']) for r in rs):.3f} | "
              f"{fmt(float(b['gbps_in_out']) if b else None)} | {fmt(ratio, '{:.2f}')} |")

print("\n| target | measured | ratio | verdict |")
print("|---|---|---|---|")
gpu = "GPU" in meta.get("machine", "")
host_note = "" if gpu else " (no GPU here: the target is the H200 host's, recorded for the ratio)"
n_big = max(large) if large else None
def share_row(name, g, bidir, minimum):
    """A target row: the job's GB/s against the --bidir ceiling, or NOT MEASURED."""
    if bidir:
        ratio = g / bidir
        print(f"| {name} | {g:.3f} vs {bidir:.3f} GB/s | {ratio:.2f} | {verdict(ratio >= minimum)}{host_note} |")
    else:
        print(f"| {name} | {g:.3f} GB/s, ceiling not measured | n/a | NOT MEASURED |")

if n_big:
    for kopt in sorted({k for (n, k) in by if n == n_big}, key=lambda k: (k == 0, k)):
        r = by[(n_big, kopt)]
        k = int(r["k_used"])
        share_row(f"one N={n_big} f32 job (K={'auto, ' if kopt == 0 else ''}{k}) >= 0.5 x the loopback's --bidir ceiling at K={k}",
                  float(r["gbps_in_out"]), iperf.get((k, "bidir")), SHARE_MIN)
    if (n_big, 1) in by:
        share_row(f"one stream (K=1), N={n_big}: >= 0.8 x one TCP connection both ways",
                  float(by[(n_big, 1)]["gbps_in_out"]), iperf.get((1, "bidir")), ONE_STREAM_MIN)
    if (n_big, 0) in by:
        g = float(by[(n_big, 0)]["gbps_in_out"])
        print(f"| one N={n_big} job >= 8 GB/s in+out (auto K = {by[(n_big, 0)]['k_used']}) | {g:.3f} GB/s | {g / 8:.2f} | {verdict(g >= 8)}{host_note} |")
for (n, kopt), (g, b, ratio, kused) in sorted(cli_med.items()):
    name = f"dgmm-cli --random={n} --stripes={'auto' if kopt == 0 else kopt} (K={kused}) >= 0.9 x the bench's figure"
    if ratio is None:
        print(f"| {name} | {g:.3f} GB/s, no bench row for this N and K | n/a | NOT MEASURED |")
    else:
        why = "" if ratio >= CLI_MIN else " (the CLI is a new process: its gRPC buffers and heap are new, where the bench's client is warm; it opens its connections and touches C before the RPC)"
        print(f"| {name} | {g:.3f} vs {float(b['gbps_in_out']):.3f} GB/s | {ratio:.2f} | {verdict(ratio >= CLI_MIN)}{why} |")
for n in small:
    if (n, 0) not in by or (n, 1) not in by:
        continue
    auto, one = by[(n, 0)], by[(n, 1)]
    ratio = float(one["median_s"]) / float(auto["median_s"])
    # Auto K must be 1 here (the same path as one stream); timing noise aside.
    ok = int(auto["k_used"]) == 1 and ratio >= 0.9
    print(f"| N={n}: default K ({auto['k_used']}) not slower than one stream | {float(auto['median_s']):.4f} s vs {float(one['median_s']):.4f} s | {ratio:.2f} | {verdict(ok)} |")
print("\nratio: job GB/s in+out / the ceiling (or CLI / bench), against the target's factor (0.5, 0.8, 0.9); GB/s target: measured / 8. Small N: "
      "one-stream time / default-K time (>= 0.9 allowed for timing noise, the same code path when auto K = 1).")
PY
cat "$out/stripe_bench.md"
