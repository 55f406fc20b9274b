#!/usr/bin/env python3
"""The Python client (dgmm, a binding of the C++ client) against the C++
client itself on the same jobs and the same server, and NumPy's A*d.

Starts dgmm-server (tests/support/dgmm_server.py), then for each N runs one
N x N float32 job (A·diag(d), side right, a preallocated output) many times
through
  - the C++ client: dgmm_cpp_client_timing (client/python/tools; built with
    the tree into <build>/python), dgmm::Client::Multiply in a loop;
  - the Python client: dgmm.Client.multiply(a, d, out=c), and also without
    out= (a new array per call);
  - NumPy: np.multiply(a, d, out=c) in this process (no server);
  - the Node client (client/node/dgmm.js, the addon over the C++ client): bench/node_client_timing.js,
    multiply(client, a, n, n, d, 'right', {out: c}) in a loop, when node
    (--node) and client/node/node_modules are there (else the column is
    skipped with a note).
Each round of each client is a new process with a new connection, its own
random job and the same warm-up calls (which also let gRPC's flow-control
windows grow); C++, Python and Node rounds alternate (ROUNDS of each) so
that drift on a shared machine hits all; the figure is the median over
every timed call. "Py new" (a new result array per call) and NumPy run in this
process. Then a 1x1 job the same way, for the per-call overhead.

Targets (the issue "The Python client at C++ speed"):
  - throughput at each N: C++ time / Python time >= 0.9;
  - 1x1 per call: Python time / C++ time <= 1.2.
Each is printed as MET or MISSED with its ratio. The Node client has no
target (it is measured for comparison): its line per N gives
C++/Node and Node's MB/s. --out also writes the report (with date,
machine, commit and command) to a file.

  build/python-venv/bin/python bench/python_client_bench.py --n 1000 4000 --backend cpu
  python3 bench/python_client_bench.py --n 4000 10000 20000        # GPU host, see README

The dgmm package is imported as installed, else from <build>/python (the
staged package, with an extension built for this Python: cmake -DDGMM_PYTHON).
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess, reference, tolerance  # noqa: E402

NODE_TOOL = os.path.join(REPO, "bench", "node_client_timing.js")


def import_dgmm(build):
    sys.path.append(os.path.join(build, "python"))
    import dgmm
    return dgmm


def machine():
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    gpus = ""
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "%s; %s; %d cores; %s; Python %s; NumPy %s" % (
        socket.gethostname(), cpu, os.cpu_count() or 0, gpus.replace("\n", ", ") or "no GPU",
        platform.python_version(), np.__version__)


def commit():
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+uncommitted" if dirty else "")
    except OSError:
        return "unknown"


def cpp_times(tool, address, n, repeats, warmup):
    run = subprocess.run([tool, address, str(n), str(repeats), str(warmup), "f32"],
                         capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        raise SystemExit("python_client_bench: %s failed (%d): %s"
                         % (tool, run.returncode, run.stderr.strip()))
    return json.loads(run.stdout)["seconds"]


def node_check(node):
    """(node path, version, None) when the Node column can run, else
    (None, None, why not)."""
    path = shutil.which(node) if node else None
    if not path:
        return None, None, "node not found (%s); --node PATH" % (node or "no --node")
    addon = os.path.join(REPO, "client", "node", "build", "dgmm.node")
    if not os.path.isfile(addon):
        return None, None, ("%s is missing (npm install ./client/node, or ctest's node_package "
                            "fixture)" % addon)
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, None, "cannot run %s: %s" % (path, e)
    return path, "%s, the client/node addon" % version, None


def node_times(node, address, n, repeats, warmup):
    run = subprocess.run([node, NODE_TOOL, address, str(n), str(repeats), str(warmup), "f32"],
                         capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        raise SystemExit("python_client_bench: %s failed (%d): %s"
                         % (NODE_TOOL, run.returncode, run.stderr.strip()[-2000:]))
    return json.loads(run.stdout.strip().splitlines()[-1])["seconds"]


def python_times(client, a, d, out, repeats, warmup):
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        client.multiply(a, d, out=out)
        took = time.perf_counter() - start
        if i >= warmup:
            times.append(took)
    return times


def python_worker(address, n, repeats, warmup, build):
    """The Python side of one round, as the C++ harness does it: a new
    process with a new connection, its own random job, WARMUP untimed calls,
    then REPEATS timed ones; prints {"n": N, "seconds": [...]}. Checks the
    first result against the float64 reference."""
    dgmm = import_dgmm(build)
    rng = np.random.default_rng()
    a = rng.uniform(-4, 4, (n, n)).astype(np.float32)
    d = rng.uniform(-4, 4, n).astype(np.float32)
    out = np.full((n, n), np.nan, np.float32)
    with dgmm.Client(address) as client:
        client.multiply(a, d, out=out)
        np.testing.assert_allclose(out, reference(a, d, "right"), rtol=tolerance(np.float32),
                                   atol=0)
        times = python_times(client, a, d, out, repeats, max(0, warmup - 1))
    print(json.dumps({"n": n, "seconds": times}))
    return 0


def py_times(address, n, repeats, warmup, build):
    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", address, str(n),
                          str(repeats), str(warmup), "--build", build],
                         capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        raise SystemExit("python_client_bench: the Python worker failed (%d): %s"
                         % (run.returncode, run.stderr.strip()[-2000:]))
    return json.loads(run.stdout.strip().splitlines()[-1])["seconds"]


def python_new_array_times(client, a, d, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        client.multiply(a, d)
        times.append(time.perf_counter() - start)
    return times


def numpy_times(a, d, out, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.multiply(a, d, out=out)
        times.append(time.perf_counter() - start)
    return times


def compare(ratio):
    """Words for C++ time / Node time."""
    if ratio >= 0.9:
        return "on par with C++"
    if ratio >= 0.5:
        return "slower than C++"
    return "far below C++"


def plan(n):
    """(repeats per round, warm-up calls) for an N x N float32 job. The C++
    harness is a new process (a new connection) each round: its warm-up
    calls also let gRPC's flow-control windows grow (BDP probing), which
    takes a few calls of a fresh connection, about 200 MB here."""
    nbytes = 4 * n * n
    if n == 1:
        return 400, 50
    repeats = max(2, min(30, int(2e9 // nbytes)))
    warmup = max(2, min(10, int(2e8 // nbytes)))
    return repeats, warmup


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating C++/Python/Node rounds")
    parser.add_argument("--build", default=os.environ.get("DGMM_BUILD_DIR",
                                                          os.path.join(REPO, "build")))
    parser.add_argument("--server-bin", help="default: <build>/service/dgmm-server")
    parser.add_argument("--backend", default=None,
                        help="the server's --backend (cpu, cuda-kernel, ...); default: its own choice")
    parser.add_argument("--server-flags", default="", help="more dgmm-server flags")
    parser.add_argument("--node", default="node",
                        help="the Node.js binary for the Node client column (default: node on "
                             "PATH); the column is skipped when it or client/node/node_modules "
                             "is missing")
    parser.add_argument("--max-repeats", type=int, default=None,
                        help="at most this many timed calls per round (default: plan(), up to "
                             "30; fewer for a slow machine at large N)")
    parser.add_argument("--out", help="also write the report here")
    parser.add_argument("--worker", nargs=4, metavar=("ADDRESS", "N", "REPEATS", "WARMUP"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        address, n, repeats, warmup = args.worker
        return python_worker(address, int(n), int(repeats), int(warmup), args.build)

    dgmm = import_dgmm(args.build)
    tool = os.path.join(args.build, "python", "dgmm_cpp_client_timing")
    if not os.access(tool, os.X_OK):
        raise SystemExit("python_client_bench: %s is missing; build the tree first" % tool)
    server_bin = args.server_bin or os.path.join(args.build, "service", "dgmm-server")
    flags = shlex.split(args.server_flags)
    server = ServerProcess(server_bin, flags=flags, backend=args.backend, start_timeout=120,
                           prefix="dgmm-pybench-")
    lines = []

    def say(line=""):
        print(line, flush=True)
        lines.append(line)

    node, node_version, node_missing = node_check(args.node)
    say("# python_client_bench: the Python client (dgmm._core) against the C++ client"
        + (", and the Node client" if node else ""))
    say("date: %s" % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    say("machine: %s" % machine())
    say("commit: %s" % commit())
    say("load average at the start: %.2f %.2f %.2f (other work on the machine)" % os.getloadavg())
    say("command: %s" % " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv))
    say("server: %s %s (backend %s); dgmm from %s" % (server_bin, " ".join(flags),
                                                     args.backend or "auto",
                                                     os.path.dirname(dgmm.__file__)))
    if node:
        say("node: %s (%s), client/node/dgmm.js through %s" % (node, node_version,
                                                              os.path.relpath(NODE_TOOL, REPO)))
    else:
        say("node: skipped, %s" % node_missing)
    say()
    head = "%7s %8s %12s %12s %12s %12s %10s" % ("N", "calls", "C++ ms", "Python ms", "Py new ms",
                                                "NumPy ms", "C++/Py")
    say(head + (" %12s %10s" % ("Node ms", "C++/Node") if node else ""))
    verdicts, node_lines = [], []
    try:
        with dgmm.Client(server.address) as client:
            for n in list(args.n) + [1]:
                rng = np.random.default_rng(n)
                a = rng.uniform(-4, 4, (n, n)).astype(np.float32)
                d = rng.uniform(-4, 4, n).astype(np.float32)
                out = np.full((n, n), np.nan, np.float32)
                repeats, warmup = plan(n)
                if args.max_repeats and n > 1:
                    repeats = max(1, min(repeats, args.max_repeats))
                cpp, py, nd = [], [], []
                for _ in range(args.rounds):
                    cpp += cpp_times(tool, server.address, n, repeats, warmup)
                    py += py_times(server.address, n, repeats, warmup, args.build)
                    if node:
                        nd += node_times(node, server.address, n, repeats, warmup)
                client.multiply(a, d, out=out)
                np.testing.assert_allclose(out, reference(a, d, "right"),
                                           rtol=tolerance(np.float32), atol=0)
                new = python_new_array_times(client, a, d, max(2, repeats // 2))
                ref = numpy_times(a, d, out, max(2, repeats // 2))
                c_ms, p_ms = statistics.median(cpp) * 1e3, statistics.median(py) * 1e3
                row = "%7d %8d %12.3f %12.3f %12.3f %12.3f %10.3f" % (
                    n, len(cpp), c_ms, p_ms, statistics.median(new) * 1e3,
                    statistics.median(ref) * 1e3, c_ms / p_ms)
                if node:
                    n_ms = statistics.median(nd) * 1e3
                    row += " %12.3f %10.3f" % (n_ms, c_ms / n_ms)
                say(row)
                if n == 1:
                    ratio = p_ms / c_ms
                    verdicts.append("1x1 per call: Python/C++ = %.3f (target <= 1.2): %s"
                                    % (ratio, "MET" if ratio <= 1.2 else "MISSED"))
                    if node:
                        node_lines.append("1x1 per call: Node %.3f ms, C++ %.3f ms, Node/C++ = %.3f"
                                          " (no target)" % (n_ms, c_ms, n_ms / c_ms))
                else:
                    ratio = c_ms / p_ms
                    mb_s = 2 * 4 * n * n / (p_ms / 1e3) / 1e6
                    verdicts.append("N=%d throughput: Python %.0f MB/s in+out, C++/Python = %.3f "
                                    "(target >= 0.9): %s" % (n, mb_s, ratio,
                                                             "MET" if ratio >= 0.9 else "MISSED"))
                    if node:
                        node_lines.append(
                            "N=%d Node: %.0f MB/s in+out against C++ %.0f MB/s, C++/Node = %.3f: "
                            "Node takes %.2fx the C++ client's time (%s; no target)" % (
                                n, 2 * 4 * n * n / (n_ms / 1e3) / 1e6, 2 * 4 * n * n / (c_ms / 1e3) / 1e6,
                                c_ms / n_ms, n_ms / c_ms, compare(c_ms / n_ms)))
    finally:
        server.stop()
    say()
    for v in verdicts:
        say(v)
    for v in node_lines:
        say(v)
    if not node:
        say("Node client: not measured (%s)" % node_missing)
    say("load average at the end: %.2f %.2f %.2f" % os.getloadavg())
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
