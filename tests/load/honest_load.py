#!/usr/bin/env python3
"""Honest load is never lost, hung or shut out: the tests.

Each test starts a real dgmm-server on loopback (--backend=cpu
--host_memory_budget=256MiB, defaults otherwise), loads it from many client
*processes* on this host through the project's client libraries, checks every
result against a float64 NumPy reference, and asserts what the issue asks:

  mixed     N client processes (Python binding, Node, dgmm-cli in turn), each
            running random jobs (shapes log-uniform, matrix + diagonal up to
            15.5 MiB: under the 16 MiB unary limit; unary, streamed and the
            client's own choice) for D seconds, default retry policies:
            0 lost, 0 wrong, 0 refused after retries, 0 hung (deadline), the
            server's completed-job count equal to the clients' OK count, and
            the server's peak RSS within host budget + transport quota +
            96 MiB (docs/operations.md section 12).
  fairness  one hostile process holding 1000 stalled MultiplyStream calls (half
            send a header and then nothing, half send nothing; each reopened
            when the server ends it) and 16 honest client processes, all from
            127.0.0.1: every honest job succeeds (retries within the deadline
            allowed). --proxy: the same with every connection (hostile and
            honest) through a TCP proxy (tests/load/tcp_proxy.py).
  flood     unary floods of ~15 MiB Multiply calls at 64 and 128 in flight, one
            connection each, from 4 processes: first raw (grpcio, one attempt
            per call, but a call that met a GOAWAY before the server saw it
            is sent again and reported) to count what ends as the transport quota's
            RESOURCE_EXHAUSTED ("Buffers full", no dgmm-origin trailer) against
            dgmm's own refusals, and whether the server's rejected_jobs account
            for every refusal; then the same flood through the Python binding
            with its retries (stream=False): the outcome a user sees.

  tests/load/honest_load.py mixed|fairness|flood [--proxy] [--short]
      --server BUILD/service/dgmm-server --cli BUILD/client/cpp/dgmm-cli

Exit 0 when every assertion holds, 1 when one fails (each is printed), 77
when something the test needs is missing. The Python that runs it must import
the dgmm package (build/python-venv/bin/python, or any python3 with
PYTHONPATH=client/python and a built tree); worker processes use the same
interpreter. Node clients are left out (said so) when client/node's addon
has not been built.

bench/attacks.py runs the long forms as rows of the attack table
(honest_mixed, honest_fair, honest_fair_proxy, honest_flood) via run().
"""
import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
MIB = 1 << 20
OVERHEAD = 96 * MIB  # the documented fixed overhead (bench/attacks.py, docs/operations.md 12)

sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess  # noqa: E402

_child_env = dict(os.environ)
_source_package = os.path.join(REPO, "client", "python")
try:
    import dgmm  # noqa: F401
except ImportError:  # a plain python3 and a built tree: the source package plus build/python
    sys.path.insert(0, _source_package)
    try:
        import dgmm  # noqa: F401,E402
    except ImportError as e:
        print("SKIP: the dgmm Python package does not import (%s); build the tree first" % e)
        sys.exit(77)
if os.path.abspath(dgmm.__file__).startswith(_source_package + os.sep):
    # Imported from the source tree (bench/attacks.py does that): so must the workers.
    _child_env["PYTHONPATH"] = os.pathsep.join(
        [_source_package] + [x for x in [os.environ.get("PYTHONPATH")] if x])


def parse_bytes(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    return int(text[:-3]) * units[text[-3:]] if text[-3:] in units else int(text)


def transport_quota(budget):
    """The transport quota the server derives with `auto` (service/flags.cc)."""
    return max(min(max(budget // 2, 64 * MIB), 256 * MIB), 16 * MIB + 16 * MIB)


def proc_status(pid, key):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def fd_count(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return 0


def percentile(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))]


class Env:
    """What the tests need: binaries, the server flags, scratch space."""

    def __init__(self, args):
        self.args = args
        self.server_bin = args.server
        self.cli = args.cli
        self.python = args.python or sys.executable
        self.budget = parse_bytes(args.budget)
        self.flags = ["--backend=cpu", "--host_memory_budget=" + args.budget] + list(args.server_flag)
        self.rss_bound = self.budget + transport_quota(self.budget) + OVERHEAD
        self.scratch = tempfile.mkdtemp(prefix="dgmm-honest-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.node = self._node(args.node)
        self.notes = []
        if not self.node:
            self.notes.append("node clients left out: " + self.node_missing)

    def _node(self, node):
        node = node or shutil.which("node")
        if not node:
            self.node_missing = "no node"
            return None
        # client/node with its addon (built by tests/node's node_package fixture).
        addon = os.path.join(REPO, "client", "node", "build", "dgmm.node")
        if os.path.exists(addon):
            return node
        self.node_missing = "client/node has no build/dgmm.node (ctest's node_package fixture builds it)"
        return None

    def kinds(self):
        return ["python", "node", "cli"] if self.node else ["python", "cli"]

    def cleanup(self):
        shutil.rmtree(self.scratch, ignore_errors=True)


class Watched:
    """A server with a sampler of its RSS and descriptors."""

    def __init__(self, env, extra_flags=()):
        self.server = ServerProcess(binary=env.server_bin, flags=env.flags + list(extra_flags),
                                    backend=None)
        self.pid = self.server.process.pid
        self.address = self.server.address
        self.max_fds = 0
        self.client = dgmm.Client(self.address)
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self):
        while not self._stop.wait(0.1):
            self.max_fds = max(self.max_fds, fd_count(self.pid))

    def peak(self):
        return proc_status(self.pid, "VmHWM")

    def counters(self):
        """(completed, rejected by reason, queued, running, reserved) over every device."""
        info = self.client.server_info()
        completed, queued, running, reserved = 0, 0, 0, 0
        rejected = collections.Counter()
        for dev in info.devices:
            completed += dev.completed_jobs
            queued += dev.queued_jobs
            running += dev.running_jobs
            reserved += dev.reserved_bytes
            for k, v in dev.rejected_jobs.items():
                rejected[k] += v
        return completed, rejected, queued, running, reserved

    def settled_counters(self, timeout=30):
        """counters() once nothing is queued or running any more."""
        t0 = time.monotonic()
        c = self.counters()
        while (c[2] or c[3]) and time.monotonic() - t0 < timeout:
            time.sleep(0.1)
            c = self.counters()
        time.sleep(0.3)  # a finished job's counter is bumped as its call ends
        return self.counters()

    def stop(self):
        self._stop.set()
        self._sampler.join()
        self.client.close()
        exited = self.server.process.poll()
        self.server.stop()
        return exited, self.server.process.returncode


def start_time(n):
    """When n worker processes started now can all begin together."""
    return time.time() + 1.5 + 0.05 * n  # after every interpreter has started


def run_workers(env, address, n, duration, concurrency, max_bytes, deadline, seed, mode="mixed",
                kinds=None, max_wall=None, start_at=None, edge_jobs=False):
    """n honest worker processes (kinds in turn), started together (at
    start_at); their records (each with "worker") and exit codes."""
    kinds = kinds or env.kinds()
    start_at = start_at or start_time(n)
    procs = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        report = os.path.join(env.scratch, "worker-%d-%d.json" % (seed, i))
        argv = [env.python, os.path.join(HERE, "honest_worker.py"), "--kind", kind, "--server", address,
                "--seed", str(seed * 1000 + i), "--duration", str(duration),
                "--concurrency", str(concurrency), "--max_bytes", str(max_bytes), "--mode", mode,
                "--deadline", str(deadline), "--cli", env.cli or "", "--node", env.node or "node",
                "--scratch", env.scratch, "--start_at", "%.3f" % start_at, "--report", report]
        if edge_jobs and i < len(kinds):  # the edge jobs once through each client library
            argv.append("--edge_jobs")
        log = open(os.path.join(env.scratch, "worker-%d-%d.log" % (seed, i)), "w")
        procs.append((i, kind, report, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=_child_env),
                      log.name))
    wall = max_wall or (1.5 + 0.05 * n + duration + deadline + 60)
    t_end = time.monotonic() + wall
    records, exits = [], []
    for i, kind, report, proc, logname in procs:
        try:
            proc.wait(max(1.0, t_end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        exits.append((i, kind, proc.returncode, logname))
        try:
            with open(report) as f:
                for r in json.load(f):
                    r["worker"] = i
                    records.append(r)
        except (OSError, ValueError):
            pass
    return records, exits


def classify(records):
    """Counts over job records: ok, wrong, refused, hung, lost (anything else)."""
    c = collections.Counter()
    codes = collections.Counter()
    for r in records:
        st = r["status"]
        if st == "OK":
            c["ok"] += 1
            if not r["correct"]:
                c["wrong"] += 1
        elif st == "RESOURCE_EXHAUSTED":
            c["refused"] += 1
        elif st in ("DEADLINE_EXCEEDED", "HUNG"):
            c["hung"] += 1
        else:
            c["lost"] += 1
        if st != "OK":
            codes["%s: %s" % (st, (r.get("details") or "")[:90])] += 1
    return c, codes


def worker_failures(exits):
    bad = []
    for i, kind, rc, logname in exits:
        if rc != 0:
            with open(logname, errors="replace") as f:
                tail = f.read()[-600:]
            bad.append("worker %d (%s) exited %s: %s" % (i, kind, rc, tail))
    return bad


def lost_codes(codes):
    """The failures of classify()'s codes that are neither refusals nor hangs."""
    return collections.Counter({k: n for k, n in codes.items()
                                if not k.startswith(("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "HUNG"))})


def describe_failures(codes, limit=6):
    return "; ".join("%d x %s" % (n, what) for what, n in codes.most_common(limit))


# ------------------------------------------------------------------ tests

def mixed(env, short):
    clients, duration, concurrency, deadline = (12, 8.0, 3, 30.0) if short else (64, 60.0, 1, 60.0)
    if env.args.clients:
        clients = env.args.clients
    if env.args.duration:
        duration = env.args.duration
    max_bytes = 15 * MIB + MIB // 2
    w = Watched(env)
    t0 = time.monotonic()
    records, exits = run_workers(env, w.address, clients, duration, concurrency, max_bytes, deadline, seed=1,
                                 edge_jobs=True)
    wall = time.monotonic() - t0
    completed, rejected, queued, running, reserved = w.settled_counters()
    peak = w.peak()
    exited_early, rc = w.stop()
    c, codes = classify(records)
    by_kind = collections.Counter(r["kind"] for r in records)
    by_mode = collections.Counter((r["kind"], r["mode"] or r["mode_asked"]) for r in records)
    retried = sum(1 for r in records if (r.get("attempts") or 0) > 1)
    lat = [r["seconds"] for r in records if r["status"] == "OK"]
    big = sum(1 for r in records if r["bytes"] > 8 * MIB)
    moved = sum(2 * r["bytes"] for r in records if r["status"] == "OK")
    fails = []
    if c["lost"]:
        fails.append("lost %d (%s)" % (c["lost"], describe_failures(lost_codes(codes))))
    if c["wrong"]:
        fails.append("wrong %d" % c["wrong"])
    if c["refused"]:
        fails.append("refused after retries %d of %d" % (c["refused"], len(records)))
    if c["hung"]:
        fails.append("hung (deadline) %d" % c["hung"])
    if completed != c["ok"]:
        fails.append("server completed %d != clients' OK %d" % (completed, c["ok"]))
    if peak > env.rss_bound:
        fails.append("peak RSS %d MiB > bound %d MiB" % (peak // MIB, env.rss_bound // MIB))
    fails += worker_failures(exits)
    for kind in env.kinds():
        for mode in ("unary", "stream"):
            if by_mode[(kind, mode)] == 0:
                fails.append("no %s job went %s (coverage)" % (kind, mode))
    if exited_early is not None or rc not in (0, None):
        fails.append("server exit %s / %s" % (exited_early, rc))
    lines = [
        "mixed load: %d client processes (%s) x %d in flight, %.0f s, deadline %.0f s, "
        "server %s, wall %.1f s" % (clients, "/".join(env.kinds()), concurrency, duration, deadline,
                                    " ".join(env.flags), wall),
        "  jobs %d (%s); unary/stream by client: %s" % (
            len(records), ", ".join("%s %d" % kv for kv in sorted(by_kind.items())),
            ", ".join("%s %s %d" % (k, m, n) for (k, m), n in sorted(by_mode.items()))),
        "  OK %d, wrong %d, refused %d, hung %d, lost %d; retried %d; jobs over 8 MiB %d, largest %.1f MiB; "
        "moved %.2f GiB" % (c["ok"], c["wrong"], c["refused"], c["hung"], c["lost"], retried, big,
                            max([r["bytes"] for r in records] or [0]) / MIB, moved / (1 << 30)),
        "  latency p50 %.1f / p99 %.1f / max %.1f ms" % (percentile(lat, 0.5) * 1e3, percentile(lat, 0.99) * 1e3,
                                                        max(lat or [float("nan")]) * 1e3),
        "  server: completed %d (clients' OK %d), rejected %s, at the end queued %d running %d reserved %d; "
        "peak RSS %d MiB (bound %d MiB)" % (completed, c["ok"], dict(rejected), queued, running, reserved,
                                            peak // MIB, env.rss_bound // MIB),
    ]
    edge = [r for r in records if r.get("edge")]
    lines.append("  edge jobs (2x600000 / 600000x2 float64, a 4.8 MiB line, 14.4 MiB: unary fits, streaming "
                 "cannot; client's own mode): %s" % ", ".join(
                     "%s %s %s" % (r["kind"], r["layout"], r["status"] if r["status"] != "OK" else "OK " + r["mode"])
                     for r in edge))
    if codes:
        lines.append("  failures: " + describe_failures(codes, 10))
    row = dict(attack="honest mixed load: %d client processes (%s), %.0f s, random shapes <= 15.5 MiB, "
               "unary and streamed" % (clients, ", ".join(env.kinds()), duration),
               outcome="OK %d/%d, lost %d, wrong %d, refused %d, hung %d; server completed %d" % (
                   c["ok"], len(records), c["lost"], c["wrong"], c["refused"], c["hung"], completed),
               peak=peak, fds=w.max_fds,
               second=("%d/%d (%.1f%%)" % (c["ok"], len(records), 100.0 * c["ok"] / max(1, len(records))),
                       "p50 %.1f / p99 %.1f ms" % (percentile(lat, 0.5) * 1e3, percentile(lat, 0.99) * 1e3)),
               recover=None)
    return row, lines, fails


def fairness(env, short, proxy):
    honest, duration, deadline = (16, 5.0, 20.0) if short else (16, 30.0, 60.0)
    if env.args.clients:
        honest = env.args.clients
    if env.args.duration:
        duration = env.args.duration
    streams = env.args.streams
    max_bytes = 1 * MIB if short else 4 * MIB
    w = Watched(env)
    target = w.address
    proxy_proc = None
    if proxy:
        proxy_report = os.path.join(env.scratch, "proxy.json")
        proxy_proc = subprocess.Popen([sys.executable, os.path.join(HERE, "tcp_proxy.py"), "--upstream", w.address,
                                       "--report", proxy_report], stdout=subprocess.PIPE, text=True)
        line = proxy_proc.stdout.readline()
        target = "127.0.0.1:%d" % int(line.split()[1])
    hostile_report = os.path.join(env.scratch, "hostile.json")
    hostile = subprocess.Popen([sys.executable, os.path.join(HERE, "stall_client.py"), "--server", target,
                                "--streams", str(streams), "--report", hostile_report],
                               stdout=subprocess.PIPE, text=True, env=_child_env)
    line = hostile.stdout.readline()
    if not line.startswith("holding"):
        raise RuntimeError("the stalling client did not start: %r" % line)
    time.sleep(1.0)
    _, rejected_before, queued_h, running_h, _ = w.counters()
    t0 = time.monotonic()
    records, exits = run_workers(env, target, honest, duration, 1, max_bytes, deadline, seed=2)
    wall = time.monotonic() - t0
    hostile.terminate()
    hostile.wait(60)
    hstats = json.load(open(hostile_report)) if os.path.exists(hostile_report) else {}
    pstats = {}
    if proxy_proc:
        proxy_proc.terminate()
        proxy_proc.wait(30)
        pstats = json.load(open(proxy_report)) if os.path.exists(proxy_report) else {}
    completed, rejected, _, _, _ = w.settled_counters()
    peak = w.peak()
    w.stop()
    c, codes = classify(records)
    lat = [r["seconds"] for r in records if r["status"] == "OK"]
    per_worker = collections.Counter(r["worker"] for r in records if r["status"] == "OK")
    fails = []
    if len(records) > c["ok"]:
        fails.append("honest jobs failed %d of %d (%s)" % (len(records) - c["ok"], len(records),
                                                           describe_failures(codes)))
    if c["wrong"]:
        fails.append("wrong %d" % c["wrong"])
    if hstats.get("opened", 0) < streams:
        fails.append("the hostile client opened %s streams, not %d: no attack" % (hstats.get("opened"), streams))
    starved = [i for i in range(honest) if per_worker[i] == 0]
    if starved:
        fails.append("honest processes with no job done: %s" % starved)
    fails += worker_failures(exits)
    if peak > env.rss_bound:
        fails.append("peak RSS %d MiB > bound %d MiB" % (peak // MIB, env.rss_bound // MIB))
    where = "through a TCP proxy (every connection one upstream connection)" if proxy else "direct"
    rate = 100.0 * (c["ok"] - c["wrong"]) / max(1, len(records))
    lines = [
        "fairness %s: 1 hostile process with %d stalled streams (half header then nothing, half nothing) "
        "and %d honest processes (%s), %.0f s, all from 127.0.0.1; wall %.1f s" % (
            where, streams, honest, "/".join(env.kinds()), duration, wall),
        "  honest: OK %d of %d (%.1f%%), wrong %d, refused %d, hung %d, lost %d; latency p50 %.1f / p99 %.1f ms" % (
            c["ok"], len(records), rate, c["wrong"], c["refused"], c["hung"], c["lost"],
            percentile(lat, 0.5) * 1e3, percentile(lat, 0.99) * 1e3),
        "  hostile: %s; the server held queued %d running %d of them when honest load began" % (
            hstats, queued_h, running_h),
        "  server: completed %d, rejected %s; peak RSS %d MiB%s" % (
            completed, dict(rejected), peak // MIB, (", proxy %s" % pstats) if proxy else ""),
    ]
    if codes:
        lines.append("  honest failures: " + describe_failures(codes, 10))
    row = dict(attack="fair share %s: %d stalled streams from one process + %d honest processes, same host" % (
        "behind a TCP proxy" if proxy else "on one host", streams, honest),
        outcome="honest OK %d/%d, refused %d, hung %d, lost %d" % (c["ok"] - c["wrong"], len(records),
                                                                   c["refused"], c["hung"], c["lost"]),
        peak=peak, fds=w.max_fds,
        second=("%d/%d (%.1f%%)" % (c["ok"] - c["wrong"], len(records), rate),
                "p50 %.1f / p99 %.1f ms" % (percentile(lat, 0.5) * 1e3, percentile(lat, 0.99) * 1e3)),
        recover=None)
    return row, lines, fails


def flood(env, short):
    levels = env.args.levels or ([64] if short else [64, 128])
    rounds = 1 if short else 2
    procs = 4
    lines, fails, outcomes = [], [], []
    peak_all, fds_all = 0, 0  # over every server of the flood
    for calls in levels:
        for via in ("raw", "binding"):
            w = Watched(env)
            completed0, rejected0, _, _, _ = w.counters()
            start_at = time.time() + 3.0
            workers = []
            for p in range(procs):
                report = os.path.join(env.scratch, "flood-%d-%s-%d.json" % (calls, via, p))
                n = calls // procs + (1 if p < calls % procs else 0)
                workers.append((report, subprocess.Popen(
                    [env.python, os.path.join(HERE, "flood_client.py"), "--server", w.address,
                     "--calls", str(n), "--rounds", str(rounds), "--via", via, "--seed", str(p + 1),
                     "--start_at", "%.3f" % start_at, "--report", report], env=_child_env)))
            records = []
            for report, proc in workers:
                try:
                    proc.wait(300)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                if proc.returncode != 0:
                    fails.append("flood process (%d in flight, %s) exited %s" % (calls, via, proc.returncode))
                try:
                    records += json.load(open(report))
                except (OSError, ValueError):
                    pass
            completed, rejected, _, _, _ = w.settled_counters()
            peak = w.peak()
            w.stop()
            peak_all = max(peak_all, peak)
            fds_all = max(fds_all, w.max_fds)
            d_completed = completed - completed0
            d_rejected = rejected - rejected0
            ok = sum(1 for r in records if r["status"] == "OK")
            wrong = sum(1 for r in records if r["status"] == "OK" and not r["correct"])
            re_ = [r for r in records if r["status"] == "RESOURCE_EXHAUSTED"]
            transport = sum(1 for r in re_ if r["origin"] != "server")
            dgmm_ref = sum(1 for r in re_ if r["origin"] == "server")
            no_push = sum(1 for r in re_ if not r["pushback"])
            other = collections.Counter("%s: %s" % (r["status"], r["details"][:80]) for r in records
                                        if r["status"] not in ("OK", "RESOURCE_EXHAUSTED"))
            failed = len(records) - ok
            counted = sum(d_rejected.values())
            total = calls * rounds
            tag = "%d in flight, %s" % (calls, via)
            if len(records) != total:
                fails.append("%s: %d of %d calls reported" % (tag, len(records), total))
            if wrong:
                fails.append("%s: wrong %d" % (tag, wrong))
            # Raw calls are not retried: UNAVAILABLE (a reset connection) is retryable and
            # only has to be counted; any other code, or INTERNAL, is a lost result.
            lost = collections.Counter({k: n for k, n in other.items()
                                        if via == "binding" or not k.startswith("UNAVAILABLE")})
            if lost:
                fails.append("%s: lost %d (%s)" % (tag, sum(lost.values()), describe_failures(lost)))
            if d_completed != ok:
                fails.append("%s: server completed %d != clients' OK %d" % (tag, d_completed, ok))
            if peak > env.rss_bound:
                fails.append("%s: peak RSS %d MiB > bound %d MiB" % (tag, peak // MIB, env.rss_bound // MIB))
            if via == "raw":
                if counted != failed:
                    fails.append("%s: the server counted %d refusals (%s), the clients saw %d" % (
                        tag, counted, dict(d_rejected), failed))
                if transport:
                    fails.append("%s: %d calls cancelled by the transport (RESOURCE_EXHAUSTED without "
                                 "dgmm-origin; docs/operations.md section 12 says floods wait)" % (tag, transport))
                if no_push:
                    fails.append("%s: %d RESOURCE_EXHAUSTED without grpc-retry-pushback-ms" % (tag, no_push))
            else:
                if re_:
                    fails.append("%s: refused after retries %d of %d" % (tag, len(re_), total))
            attempts = sum(r.get("attempts") or 0 for r in records)
            # Raw calls sent again because a GOAWAY met them before the server
            # saw them (flood_client.py): gRPC's reclaimer closing idle
            # connections. The binding does not report it (-1, as for transport).
            goaway = sum(r.get("goaway") or 0 for r in records)
            details = collections.Counter(r["details"][:60] for r in re_)
            lines.append(
                "flood %s: %d calls of %.1f MiB (%d rounds, %d processes): OK %d, wrong %d, "
                "RESOURCE_EXHAUSTED %d (transport %d, dgmm %d, without pushback %d), other %d; attempts %d "
                "(%d after a GOAWAY the server sent before it saw the call); "
                "server completed %d, rejected %s (%d counted); peak RSS %d MiB" % (
                    tag, total, 15.0, rounds, procs, ok, wrong, len(re_), transport if via == "raw" else -1,
                    dgmm_ref if via == "raw" else -1, no_push, sum(other.values()), attempts, goaway if via == "raw" else -1,
                    d_completed, dict(d_rejected), counted, peak // MIB))
            if details:
                lines.append("    refusals: " + "; ".join("%d x %s" % (n, d) for d, n in details.most_common(4)))
            if other:
                lines.append("    other: " + "; ".join("%d x %s" % (n, d) for d, n in other.most_common(4)))
            outcomes.append("%d %s: OK %d RE %d (transport %s) counted %d" % (
                calls, via, ok, len(re_), transport if via == "raw" else "?", counted))
    row = dict(attack="unary flood of 15 MiB calls at %s in flight from honest clients (raw, then the Python "
               "binding with retries)" % " and ".join(map(str, levels)),
               outcome="; ".join(outcomes), peak=peak_all, fds=fds_all, second=("-", "-"), recover=None)
    return row, lines, fails


def drain(env, short):
    """Honest processes calling in a loop while the server is SIGTERMed: each
    call that starts after the signal (in the drain window, or once the server
    is gone) ends within the clients' reconnect limit (RetryPolicy
    max_reconnect_wait, 5 s in every client) plus --drain_slack, and none waits
    out its deadline; results that came back are right."""
    clients, duration, deadline = (6, 6.0, 30.0) if short else (16, 12.0, 60.0)
    if env.args.clients:
        clients = env.args.clients
    reconnect_limit = 5.0
    limit = reconnect_limit + env.args.drain_slack
    w = Watched(env)
    start_at = start_time(clients)
    term_at = [None]
    peak = [0]

    def terminate():
        time.sleep(max(0.0, start_at + duration / 3 - time.time()))
        peak[0] = w.peak()
        term_at[0] = time.time()
        w.server.process.send_signal(signal.SIGTERM)
    killer = threading.Thread(target=terminate)
    killer.start()
    records, exits = run_workers(env, w.address, clients, duration, 2, 256 * 1024, deadline, seed=3,
                                 start_at=start_at)
    killer.join()
    try:
        w.server.process.wait(30)
    except subprocess.TimeoutExpired:
        pass
    server_rc = w.server.process.returncode
    w._stop.set()
    w.client.close()
    w.server.stop()
    after = [r for r in records if r["started"] >= term_at[0]]
    before = [r for r in records if r["started"] < term_at[0]]
    c_after, codes_after = classify(after)
    c_before, codes_before = classify(before)
    slow = [r for r in after if r["seconds"] > limit]
    fails = []
    if c_after["hung"] or c_before["hung"]:
        fails.append("calls that waited out their %.0f s deadline: %d started after SIGTERM, %d before" % (
            deadline, c_after["hung"], c_before["hung"]))
    if slow:
        fails.append("%d of %d calls started after SIGTERM took longer than the reconnect limit %.0f s + %.0f s "
                     "(slowest %.1f s: %s)" % (len(slow), len(after), reconnect_limit, env.args.drain_slack,
                                               max(r["seconds"] for r in slow),
                                               describe_failures(classify(slow)[1], 3)))
    if c_after["wrong"] + c_before["wrong"]:
        fails.append("wrong %d" % (c_after["wrong"] + c_before["wrong"]))
    if not after:
        fails.append("no call started after SIGTERM (nothing measured)")
    if server_rc != 0:
        fails.append("server exit code %s after SIGTERM" % server_rc)
    fails += worker_failures(exits)
    durations = [r["seconds"] for r in after]
    lines = [
        "drain: %d honest processes (%s) x 2 in flight, SIGTERM %.1f s into %.0f s of load, deadline %.0f s" % (
            clients, "/".join(env.kinds()), duration / 3, duration, deadline),
        "  before SIGTERM: %d calls: OK %d, wrong %d, refused %d, hung %d, other %d" % (
            len(before), c_before["ok"], c_before["wrong"], c_before["refused"], c_before["hung"], c_before["lost"]),
        "  after SIGTERM: %d calls: OK %d, refused %d, hung %d, other %d; duration p50 %.2f / max %.2f s "
        "(limit %.0f s)" % (len(after), c_after["ok"], c_after["refused"], c_after["hung"], c_after["lost"],
                            percentile(durations, 0.5), max(durations or [float("nan")]), limit),
        "  server exit code %s" % server_rc,
    ]
    if codes_before:
        lines.append("  before SIGTERM: " + describe_failures(codes_before, 6))
    if codes_after:
        lines.append("  after SIGTERM: " + describe_failures(codes_after, 6))
    row = dict(attack="honest calls through SIGTERM: %d processes, calls started in the drain window and after" % clients,
               outcome="after SIGTERM: %d calls, hung %d, slowest %.1f s (limit %.0f s)" % (
                   len(after), c_after["hung"], max(durations or [float("nan")]), limit),
               peak=peak[0], fds=w.max_fds, second=("-", "-"), recover=None)
    return row, lines, fails


TESTS = {"mixed": lambda env, a: mixed(env, a.short),
         "drain": lambda env, a: drain(env, a.short),
         "fairness": lambda env, a: fairness(env, a.short, a.proxy),
         "flood": lambda env, a: flood(env, a.short)}


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("test", choices=sorted(TESTS))
    p.add_argument("--server", default=os.environ.get("DGMM_SERVER_BIN", ""), help="dgmm-server")
    p.add_argument("--cli", default="", help="dgmm-cli (default: next to the server's build)")
    p.add_argument("--node", default="", help="node (default: from PATH)")
    p.add_argument("--python", default="", help="Python of the worker processes (default: this one)")
    p.add_argument("--budget", default="256MiB")
    p.add_argument("--server_flag", action="append", default=[], help="another server flag (repeatable)")
    p.add_argument("--short", action="store_true", help="the ctest form: scaled down, seconds")
    p.add_argument("--proxy", action="store_true", help="fairness: everything through a TCP proxy")
    p.add_argument("--clients", type=int, default=0, help="override the client processes")
    p.add_argument("--duration", type=float, default=0, help="override the seconds of load")
    p.add_argument("--streams", type=int, default=1000, help="fairness: the hostile client's stalled streams")
    p.add_argument("--levels", type=int, nargs="*", default=None, help="flood: calls in flight")
    p.add_argument("--drain_slack", type=float, default=3.0,
                   help="drain: seconds allowed past the 5 s reconnect limit (backoff, process start)")
    p.add_argument("--json", default="", help="also write {row, lines, failures} here")
    return p


def run(argv):
    """Runs one test; (row for bench/attacks.py, report lines, failures)."""
    args = parser().parse_args(argv)
    if not args.server or not os.access(args.server, os.X_OK):
        raise SystemExit("honest_load: --server (or DGMM_SERVER_BIN) must name the built dgmm-server")
    if not args.cli:
        args.cli = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.server))), "client", "cpp",
                                "dgmm-cli")
    env = Env(args)
    try:
        row, lines, fails = TESTS[args.test](env, args)
    finally:
        env.cleanup()
    lines = lines + ["  note: " + n for n in env.notes]
    return row, lines, fails


def main():
    row, lines, fails = run(sys.argv[1:])
    print("\n".join(lines))
    args = parser().parse_args(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(row=row, lines=lines, failures=fails), f, indent=1)
    if fails:
        print("FAILED:")
        for f in fails:
            print("  - " + f)
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
