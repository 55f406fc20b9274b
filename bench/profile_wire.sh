#!/usr/bin/env bash
# Where a large job's time goes on the wire (issue 26, item 3): starts one
# dgmm-server, and for each K runs one bench/stripe_bench client (N x N
# float32, side right, K stripes) that makes its matrix, runs one warm-up job
# (its connections open), then stops until the profilers are attached;
# `perf record` on the server (attached by pid) and on the client (by pid)
# then sees only --reps timed jobs (no result check, no NaN fill). For each
# side and K it writes:
#   top_sym.txt     perf report --no-children --sort sym (self time)
#   top_dso.txt     perf report --no-children --sort dso
#   threads.txt     perf report --no-children --sort pid (samples per thread: tid:name)
#   comm_sym.txt    perf report --no-children --sort comm,sym (each thread's hot symbols)
#   folded.txt      the sampled call stacks, folded (flamegraph.pl / speedscope input),
#                   most frequent first
#   perf_stat.txt   perf stat -e task-clock,context-switches,cpu-migrations,page-faults
#                   (its window: the 1 s the profilers take to attach, the timed jobs,
#                   and the stop; proc_threads.txt is the jobs' window alone)
#   proc_threads.txt  from /proc/PID/task/*/{stat,status} before and after the
#                   timed jobs: each thread's CPU seconds (user, system) and its
#                   voluntary and involuntary context switches (works without perf)
# plus client.csv (the timed jobs' figures while profiled), summary.md (the
# heads of all of these), the server log and the perf probe's log; all in one
# archive, $OUT/profile_wire.tar.gz, with summary.md beside it.
#
#   bench/profile_wire.sh [options] [-- extra dgmm-server flags]
#     --build DIR       build tree with service/dgmm-server and bench/stripe_bench
#                       (default build)
#     --backend B       dgmm-server --backend (default auto: the GPU if any)
#     --n N             matrix size (default 20000)
#     --stripes LIST    K values (default 1,8)
#     --reps R          timed jobs per K while profiled (default 3)
#     --event E         perf event (default cpu-clock: a timer, which also works in
#                       a VM without hardware counters; cycles where there are)
#     --freq HZ         samples per second per thread (default 999)
#     --call_graph CG   fp (frame pointers, perf record -g; default), dwarf, or none.
#                       Debian's gRPC, Abseil and glibc have no frame pointers: with fp
#                       the kernel part of a stack is whole and the user part mostly
#                       [unknown]; dwarf unwinds user stacks too, at many MB per second
#                       of samples (use it with --freq 199 or so)
#     --top T           lines kept of each report (default 80)
#     --keep_data       put the perf.data files in the archive too (large)
#     --perf P          auto (default: PATH, else the bundle), bundle (only
#                       $build/bench/perf.tar.xz), none (/proc only), or a perf binary
#     --out DIR         where the archive goes (default $OUT, else bench/results/wire/latest)
#     --commit SHA      commit to record (default: git rev-parse HEAD, +dirty)
#
# perf: from PATH if it runs, else $build/bench/perf.tar.xz (this build
# machine's perf with its libraries: cmake --build BUILD --target
# perf_bundle), unpacked into a temporary folder. When perf cannot sample
# here (no perf, perf_event_open refused, perf_event_paranoid), the script
# falls back as far as it must -- the --event without call graphs, then
# perf stat only, then /proc only -- and says so in summary.md.
#
# Time on the H200 host, defaults: about 1 minute (the client's random
# matrix, a warm-up and 3 timed jobs per K, then the reports).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
command_line="bench/profile_wire.sh $*"
build=build
backend=auto
n=20000
stripes=1,8
reps=3
event=cpu-clock
freq=999
call_graph=fp
top=80
keep_data=0
perf_choice=auto
out=${OUT:-}
commit=
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --stripes) stripes=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --event) event=$2; shift 2 ;;
    --freq) freq=$2; shift 2 ;;
    --call_graph) call_graph=$2; shift 2 ;;
    --top) top=$2; shift 2 ;;
    --keep_data) keep_data=1; shift ;;
    --perf) perf_choice=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "profile_wire.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
server_flags=("$@")
cd "$root"
out=${out:-bench/results/wire/latest}
mkdir -p "$out"
out=$(cd "$out" && pwd)
server_bin=$build/service/dgmm-server
bench_bin=$build/bench/stripe_bench
for b in "$server_bin" "$bench_bin"; do
  [[ -x $b ]] || { echo "profile_wire.sh: $b not built (cmake --build $build --target dgmm-server stripe_bench)" >&2; exit 2; }
done
if [[ -z $commit ]]; then
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && commit="$commit+dirty"
fi

tmp=$(mktemp -d)
res=$tmp/profile_wire
mkdir -p "$res"
server_pid=
client_pid=
bg_pids=()
# SIGINT makes perf record and perf stat write their results and exit; TERM
# after 20 s if one did not.
stop_profilers() {
  local p
  for p in "${bg_pids[@]}"; do kill -INT "$p" 2>/dev/null; done
  for p in "${bg_pids[@]}"; do
    for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -TERM "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  bg_pids=()
}
cleanup() {
  stop_profilers
  [[ -n $client_pid ]] && kill "$client_pid" 2>/dev/null
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
log=$res/profile_wire.log
: > "$log"
say() { echo "$*" | tee -a "$log" >&2; }
orig_ld=${LD_LIBRARY_PATH:-}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "machine=$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(awk '/MemTotal/ {printf "%d GiB", $2/1048576}' /proc/meminfo)${gpu:+, GPU $gpu}"
  echo "kernel=$(uname -r)"
  echo "load=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit=$commit"
  echo "command=$command_line"
  echo "server_flags=--backend=$backend ${server_flags[*]:-}"
  echo "perf_event_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo n/a)"
} > "$res/meta"
cat "$res/meta" | tee -a "$log" >&2

# ---------------------------------------------------------- perf, and what it may do here
perf_bin=
perf_lib=
if [[ $perf_choice != auto && $perf_choice != bundle && $perf_choice != none ]]; then
  perf_bin=$perf_choice
elif [[ $perf_choice == auto ]] && command -v perf > /dev/null && perf --version > /dev/null 2>&1; then
  perf_bin=$(command -v perf)
elif [[ $perf_choice != none && -f $build/bench/perf.tar.xz ]]; then
  mkdir -p "$tmp/perf" && tar -C "$tmp/perf" -xf "$build/bench/perf.tar.xz" 2>>"$log"
  if LD_LIBRARY_PATH="$tmp/perf/lib" "$tmp/perf/perf" --version > /dev/null 2>>"$log"; then
    perf_bin=$tmp/perf/perf
    perf_lib=$tmp/perf/lib
  else
    say "perf from $build/bench/perf.tar.xz does not run here (see the log)"
  fi
fi
# perf's own libraries only for perf: a program it starts gets the caller's.
# Through env, not a shell function, so that `perf ... &` leaves perf's own
# pid in $! (a backgrounded function is a subshell, which SIGINT would not
# reach perf through).
perf=(env "LD_LIBRARY_PATH=${perf_lib:+$perf_lib:}$orig_ld" "$perf_bin")
perf() { "${perf[@]}" "$@"; }
cg_flags=()
case $call_graph in
  fp) cg_flags=(-g) ;;
  dwarf) cg_flags=(--call-graph dwarf,16384) ;;
  none) cg_flags=() ;;
  *) echo "profile_wire.sh: --call_graph fp|dwarf|none" >&2; exit 2 ;;
esac
stat_events=task-clock,context-switches,cpu-migrations,page-faults
can_record=0
can_stat=0
mode_note=
if [[ -n $perf_bin ]]; then
  say "perf: $(perf --version 2>&1) ($perf_bin)"
  # Probe on a short-lived process of our own: sampling with call graphs,
  # then without, then counting.
  if perf record -e "$event" -F "$freq" "${cg_flags[@]}" -o "$tmp/probe.data" -- sleep 0.05 >> "$log" 2>&1; then
    can_record=1
  elif [[ ${#cg_flags[@]} -gt 0 ]] && perf record -e "$event" -F "$freq" -o "$tmp/probe.data" -- sleep 0.05 >> "$log" 2>&1; then
    can_record=1
    mode_note="perf record refused call graphs ($call_graph) here: flat samples only, folded stacks have one frame"
    cg_flags=()
  elif [[ $event != cpu-clock ]] && perf record -e cpu-clock -F "$freq" "${cg_flags[@]}" -o "$tmp/probe.data" -- sleep 0.05 >> "$log" 2>&1; then
    can_record=1
    mode_note="event $event refused here; sampled with cpu-clock instead"
    event=cpu-clock
  else
    mode_note="perf record refused here (see profile_wire.log): no samples; perf stat and /proc only"
  fi
  if [[ $can_record == 1 ]]; then
    # perf record quietly falls back to cpu-clock where cycles do not exist.
    used=$(perf evlist -i "$tmp/probe.data" 2>/dev/null | head -1)
    if [[ -n $used && $used != "$event" ]]; then
      mode_note="${mode_note:+$mode_note; }asked for $event, perf sampled $used (no such hardware event here)"
      event=$used
    fi
  fi
  if perf stat -e "$stat_events" -o "$tmp/probe.stat" -- true >> "$log" 2>&1; then
    can_stat=1
  else
    mode_note="${mode_note:+$mode_note; }perf stat refused here"
  fi
else
  mode_note="no perf (PATH, or $build/bench/perf.tar.xz: cmake --build $build --target perf_bundle): /proc per-thread CPU and context switches only"
  [[ $perf_choice == none ]] && mode_note="--perf none: /proc per-thread CPU and context switches only"
fi
[[ -n $mode_note ]] && say "profile_wire: $mode_note"
echo "perf_mode=record=$can_record stat=$can_stat event=$event freq=$freq call_graph=${cg_flags[*]:-none}" >> "$res/meta"
echo "perf_note=${mode_note:-perf record and perf stat work here}" >> "$res/meta"

# ---------------------------------------------------------- per-thread /proc snapshot
# snapshot PID FILE: one line per thread: tid, utime and stime (clock ticks),
# voluntary and involuntary context switches, name.
snapshot() {
  python3 - "$1" > "$2" <<'PY'
import os, sys
pid = sys.argv[1]
base = f"/proc/{pid}/task"
for tid in sorted(os.listdir(base), key=int):
    try:
        stat = open(f"{base}/{tid}/stat").read()
        status = open(f"{base}/{tid}/status").read()
    except OSError:
        continue
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    f = stat[stat.rindex(")") + 2:].split()
    utime, stime = int(f[11]), int(f[12])
    sw = {k: v.strip() for k, v in (l.split(":", 1) for l in status.splitlines() if ":" in l)}
    print(tid, utime, stime, sw.get("voluntary_ctxt_switches", "-1"),
          sw.get("nonvoluntary_ctxt_switches", "-1"), comm.replace(" ", "_"), sep="\t")
PY
}
# thread_table BEFORE AFTER WALL_S: the deltas, busiest thread first, and
# the same grouped by thread name (gRPC's and the engine's pools).
thread_table() {
  python3 - "$1" "$2" "$3" "$(getconf CLK_TCK)" <<'PY'
import collections, sys
def load(p):
    d = {}
    for line in open(p):
        tid, u, s, v, nv, comm = line.rstrip("\n").split("\t")
        d[tid] = (int(u), int(s), int(v), int(nv), comm)
    return d
before, after, wall, hz = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
rows = []
for tid, (u, s, v, nv, comm) in after.items():
    u0, s0, v0, nv0, _ = before.get(tid, (0, 0, 0, 0, comm))
    rows.append((comm, tid, (u - u0) / hz, (s - s0) / hz, v - v0, nv - nv0, tid not in before))
rows.sort(key=lambda r: -(r[2] + r[3]))
tu, ts = sum(r[2] for r in rows), sum(r[3] for r in rows)
tv, tn = sum(r[4] for r in rows), sum(r[5] for r in rows)
print(f"wall {wall:.3f} s (the timed jobs); threads alive at the end: {len(after)}; "
      f"CPU {tu + ts:.2f} s ({tu:.2f} user + {ts:.2f} system) = {(tu + ts) / wall:.2f} cores busy on average; "
      f"context switches {tv} voluntary + {tn} involuntary = {(tv + tn) / wall:.0f}/s")
print("(threads that ended during the jobs are missing; 'new' = started during them)\n")
print(f"{'thread':<18}{'tid':>8}{'user s':>9}{'sys s':>9}{'% wall':>8}{'vol cs':>9}{'invol cs':>9}")
for comm, tid, u, s, v, nv, new in rows:
    if u + s == 0 and v + nv == 0:
        continue
    print(f"{comm:<18}{tid:>8}{u:>9.2f}{s:>9.2f}{100 * (u + s) / wall:>8.1f}{v:>9}{nv:>9}{'  new' if new else ''}")
print("\nby thread name:")
g = collections.defaultdict(lambda: [0, 0.0, 0.0, 0, 0])
for comm, tid, u, s, v, nv, new in rows:
    x = g[comm]; x[0] += 1; x[1] += u; x[2] += s; x[3] += v; x[4] += nv
print(f"{'thread name':<18}{'count':>6}{'user s':>9}{'sys s':>9}{'% wall':>8}{'vol cs':>9}{'invol cs':>9}")
for comm, (c, u, s, v, nv) in sorted(g.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
    print(f"{comm:<18}{c:>6}{u:>9.2f}{s:>9.2f}{100 * (u + s) / wall:>8.1f}{v:>9}{nv:>9}")
PY
}
# folded DATA: perf script's stacks folded (root first), counted, busiest first.
folded() {
  perf script -i "$1" -F comm,ip,sym 2>>"$log" | python3 -c '
import collections, sys
counts, stack, comm = collections.Counter(), [], None
def flush():
    global stack, comm
    if comm is not None:
        frames = [comm]
        for s in reversed(stack):  # runs of [unknown] (no frame pointers) as one
            if not (s == "[unknown]" and frames[-1] == s):
                frames.append(s)
        counts[";".join(frames)] += 1
    stack, comm = [], None
for line in sys.stdin:
    line = line.rstrip("\n")
    if not line.strip():
        flush(); continue
    if not line.startswith((" ", "\t")):
        flush(); comm = line.split()[0] if line.split() else "?"; continue
    parts = line.split(None, 1)
    sym = parts[1] if len(parts) > 1 else parts[0]
    stack.append(sym.split("+0x")[0].replace(";", ":").replace(" ", "_"))
flush()
for k, v in counts.most_common():
    print(k, v)
'
}

# ---------------------------------------------------------- the server
"$server_bin" --listen=127.0.0.1:0 --port_file="$tmp/port" --backend="$backend" --allow_regions=false "${server_flags[@]}" \
  > "$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 600); do [[ -s $tmp/port ]] && break; sleep 0.1; done
[[ -s $tmp/port ]] || { cat "$tmp/server.log" >&2; echo "profile_wire.sh: server did not start" >&2; exit 1; }
target=127.0.0.1:$(cat "$tmp/port")
say "dgmm-server pid $server_pid at $target"

failed=0
for k in ${stripes//,/ }; do
  d=$res/K$k
  mkdir -p "$d"
  rm -f "$tmp/ready" "$tmp/ready.done" "$tmp/go"
  env LD_LIBRARY_PATH="$orig_ld" "$bench_bin" --target="$target" --sizes="$n" --stripes="$k" \
    --reps="$reps" --check=false --poison=false --ready_file="$tmp/ready" --go_file="$tmp/go" \
    > "$d/client.csv" 2>> "$log" &
  client_pid=$!
  ok=0
  for _ in $(seq 6000); do
    [[ -s $tmp/ready ]] && { ok=1; break; }
    kill -0 "$client_pid" 2>/dev/null || break
    sleep 0.1
  done
  [[ $ok == 1 ]] || { say "K=$k: the client did not get ready (see the log)"; failed=1; wait "$client_pid"; client_pid=; continue; }
  bg_pids=()
  if [[ $can_record == 1 ]]; then
    for side in server client; do
      pid=$server_pid; [[ $side == client ]] && pid=$client_pid
      "${perf[@]}" record -e "$event" -F "$freq" "${cg_flags[@]}" -N -p "$pid" -o "$tmp/$side-K$k.data" \
        > "$tmp/$side-K$k.record.log" 2>&1 &
      bg_pids+=($!)
    done
  fi
  if [[ $can_stat == 1 ]]; then
    for side in server client; do
      pid=$server_pid; [[ $side == client ]] && pid=$client_pid
      "${perf[@]}" stat -e "$stat_events" -p "$pid" -o "$d/$side.perf_stat.txt" > /dev/null 2>> "$log" &
      bg_pids+=($!)
    done
  fi
  [[ ${#bg_pids[@]} -gt 0 ]] && sleep 1  # the profilers attach
  snapshot "$server_pid" "$tmp/s0"
  snapshot "$client_pid" "$tmp/c0"
  t0=$(date +%s%N)
  : > "$tmp/go"
  for _ in $(seq 60000); do
    [[ -s $tmp/ready.done ]] && break
    kill -0 "$client_pid" 2>/dev/null || break
    sleep 0.01
  done
  t1=$(date +%s%N)
  snapshot "$server_pid" "$tmp/s1"
  snapshot "$client_pid" "$tmp/c1" 2>/dev/null
  stop_profilers
  : > "$tmp/go"
  wait "$client_pid" || { say "K=$k: the client failed"; failed=1; }
  client_pid=
  wall=$(python3 -c "print(($t1 - $t0) / 1e9)")
  say "K=$k: $(tail -1 "$d/client.csv") (timed jobs under the profilers: $wall s)"
  thread_table "$tmp/s0" "$tmp/s1" "$wall" > "$d/server.proc_threads.txt"
  [[ -s $tmp/c1 ]] && thread_table "$tmp/c0" "$tmp/c1" "$wall" > "$d/client.proc_threads.txt"
  if [[ $can_record == 1 ]]; then
    for side in server client; do
      data=$tmp/$side-K$k.data
      cat "$tmp/$side-K$k.record.log" >> "$log"
      [[ -s $data ]] || { say "K=$k $side: no perf data"; continue; }
      rep=(perf report -i "$data" --no-children --stdio --percent-limit 0.3 -g none)
      "${rep[@]}" --sort sym 2>>"$log" | grep -v '^$' | head -n "$top" > "$d/$side.top_sym.txt"
      "${rep[@]}" --sort dso 2>>"$log" | grep -v '^$' | head -n "$top" > "$d/$side.top_dso.txt"
      "${rep[@]}" --sort pid 2>>"$log" | grep -v '^$' | head -n "$top" > "$d/$side.threads.txt"
      "${rep[@]}" --sort comm,sym 2>>"$log" | grep -v '^$' | head -n "$top" > "$d/$side.comm_sym.txt"
      folded "$data" | head -n 500 > "$d/$side.folded.txt"
      [[ $keep_data == 1 ]] && cp "$data" "$d/$side.perf.data"
    done
  fi
done
kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
server_pid=
cp "$tmp/server.log" "$res/server.log"

# ---------------------------------------------------------- summary
{
  echo "# Wire profile: one N=$n float32 job, K = $stripes"
  echo
  while IFS='=' read -r key val; do echo "- $key: \`$val\`"; done < "$res/meta"
  echo "- client: bench/stripe_bench --sizes=$n --stripes=K --reps=$reps --check=false --poison=false"
  echo "  (warm-up job before the profilers attach; only the timed jobs are profiled)"
  echo "- server: dgmm-server --backend=$backend ${server_flags[*]:-}, one process for every K"
  for k in ${stripes//,/ }; do
    d=$res/K$k
    echo
    echo "## K=$k"
    echo
    echo '```'
    echo "client.csv: $(tail -1 "$d/client.csv" 2>/dev/null)"
    echo '```'
    for side in server client; do
      for f in proc_threads top_sym top_dso threads comm_sym perf_stat; do
        [[ -s $d/$side.$f.txt ]] || continue
        echo
        echo "### $side: $f (head)"
        echo
        echo '```'
        case $f in
          top_sym|top_dso|threads|comm_sym) grep -v '^#' "$d/$side.$f.txt" | head -n 25 ;;
          proc_threads) head -n 30 "$d/$side.$f.txt" ;;
          *) grep -v '^$' "$d/$side.$f.txt" | head -n 15 ;;
        esac
        echo '```'
      done
    done
  done
} > "$res/summary.md"
tar -C "$tmp" -czf "$out/profile_wire.tar.gz" profile_wire
cp "$res/summary.md" "$out/profile_wire_summary.md"
say "profile_wire: $out/profile_wire.tar.gz ($(du -h "$out/profile_wire.tar.gz" | cut -f1)), summary in $out/profile_wire_summary.md"
exit $failed
