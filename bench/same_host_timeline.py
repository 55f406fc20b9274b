#!/usr/bin/env python3
"""Where a same-host job's time goes on the GPU host, next to what its user
would run instead.

For N = 1000, 10000, 20000 float32 and 15000 float64 (side right, ordinary
NumPy arrays, dgmm.Client's defaults: process memory): a new process's first
job (from dgmm.Client() to the result, the import excluded; the server has
run a job of that size before), the warm job
(out reused; median), NumPy A*d and CuPy from pinned memory (medians), and
the server's own account of the warm job: DGMM_TRACE_JOBS=1 makes the CUDA
backend log where the pipeline's thread spent its time (copying pieces in,
waiting for the GPU, waiting for copies out). With CuPy, a job on CUDA IPC
regions (dgmm.CudaIpcRegion) at N = 10000: its wall time against its kernel
(JobStats.compute_ns).

    python3 bench/same_host_timeline.py --build build [--reps 5] [--out FILE]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import user_path_bench as upb  # noqa: E402

CASES = [(1000, np.float32), (10000, np.float32), (20000, np.float32), (15000, np.float64)]

FIRST_JOB = """
import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, dgmm
n, dtype = int(sys.argv[3]), np.dtype(sys.argv[4])
rng = np.random.default_rng(1)
a = rng.uniform(-4, 4, (n, n)).astype(dtype)
d = rng.uniform(-4, 4, n).astype(dtype)
c = np.empty_like(a)
c[...] = 0  # its pages exist, as a warm job's do
t0 = time.perf_counter()
client = dgmm.Client(sys.argv[2])
t1 = time.perf_counter()
_, info = client.multiply(a, d, out=c, return_info=True)
t2 = time.perf_counter()
assert np.allclose(c, a * d, rtol=1e-6 if dtype == np.float32 else 1e-14, atol=0)
print("%.3f %s%s [Client() %.1f ms, set-up %.1f ms, job %.1f ms]" % (
    (t2 - t0) * 1e3, info.mode, " process" if info.process_memory else "", (t1 - t0) * 1e3,
    info.same_host["setup"] * 1e3, info.same_host["job"] * 1e3))
"""


def trace_lines(log, since):
    """The server's trace lines written after byte `since` of its log."""
    with open(log, "rb") as f:
        f.seek(since)
        text = f.read().decode("utf-8", "replace")
    return [line for line in text.splitlines() if "trace:" in line]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    dgmm = upb.import_dgmm(args.build)
    staged = os.path.join(args.build, "python")
    work = tempfile.mkdtemp()
    log = os.path.join(work, "server.log")
    port_file = os.path.join(work, "port")
    env = dict(os.environ, DGMM_TRACE_JOBS="1")
    server = subprocess.Popen([os.path.join(args.build, "service", "dgmm-server"),
                               "--listen=127.0.0.1:0", "--port_file=" + port_file],
                              stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    out = []

    def say(line=""):
        print(line, flush=True)
        out.append(line)

    try:
        for _ in range(300):
            if os.path.exists(port_file) and open(port_file).read().endswith("\n"):
                break
            time.sleep(0.1)
        address = "127.0.0.1:" + open(port_file).read().strip()
        say("# same-host timeline, commit %s, %s" % (upb.commit(), time.strftime("%FT%TZ",
                                                                              time.gmtime())))
        say()
        say("| N, dtype | first job, new process | warm | NumPy A*d | CuPy pinned | warm / CuPy "
            "pinned | warm / NumPy | mode |")
        say("|---|---|---|---|---|---|---|---|")
        traces = []
        rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        for n, dtype in CASES:
            a = rng.uniform(-4, 4, (n, n)).astype(dtype)
            d = rng.uniform(-4, 4, n).astype(dtype)
            # The server has run a job of this size before: the first job
            # measured is the new process's, not the server's.
            with dgmm.Client(address) as warmup:
                warmup.multiply(a, d)
            first = subprocess.run([sys.executable, "-c", FIRST_JOB, staged, address, str(n),
                                    np.dtype(dtype).name], capture_output=True, text=True,
                                   timeout=300)
            if first.returncode != 0:
                raise SystemExit("first job failed: " + first.stderr[-2000:])
            first_ms, mode = first.stdout.split(None, 1)
            client = dgmm.Client(address)
            c = np.empty_like(a)
            client.multiply(a, d, out=c)
            upb.check(c, a, d) if dtype == np.float32 else None
            since = os.path.getsize(log)
            warm = upb.median_ms(lambda: client.multiply(a, d, out=c), args.reps)
            lines = trace_lines(log, since)
            traces.append(("%d %s" % (n, np.dtype(dtype).name), lines[-3:]))
            numpy_ms = upb.median_ms(lambda: a * d, args.reps)
            cupy = upb.cupy_rows(a, d, args.reps)
            pinned = cupy[1] if cupy else None
            say("| %d %s | %s ms | %.2f ms | %.2f ms | %s | %s | %.2f | %s |" % (
                n, np.dtype(dtype).name, first_ms, warm, numpy_ms,
                "%.2f ms" % pinned if pinned else "-",
                "%.2f" % (warm / pinned) if pinned else "-", warm / numpy_ms, mode.strip()))
            client.close()
        say()
        say("## The server's trace of the warm jobs (last three of each)")
        for case, lines in traces:
            say()
            say("%s:" % case)
            for line in lines:
                say("    " + re.sub(r"^.*trace: ", "", line))
        try:
            import cupy as cp
        except ImportError:
            cp = None
        if cp is not None:
            n = 10000
            ga = cp.random.uniform(-4, 4, (n, n), dtype=cp.float32)
            gd = cp.random.uniform(-4, 4, n, dtype=cp.float32)
            gc = cp.empty_like(ga)
            client = dgmm.Client(address)
            with dgmm.CudaIpcRegion(ga) as ra, dgmm.CudaIpcRegion(gc) as rc:
                ra.register(client, "timeline-a")
                rc.register(client, "timeline-c")
                client.multiply_region(ga, gd, out=gc)
                walls, kernels = [], []
                since = os.path.getsize(log)
                for _ in range(max(args.reps, 5)):
                    t0 = time.perf_counter()
                    stats = client.multiply_region(ga, gd, out=gc)
                    walls.append((time.perf_counter() - t0) * 1e3)
                    kernels.append(stats.compute_ns / 1e6)
                lines = trace_lines(log, since)
            client.close()
            wall, kernel = statistics.median(walls), statistics.median(kernels)
            say()
            say("## CUDA IPC regions, N = 10000 float32")
            say()
            say("wall %.3f ms, kernel %.3f ms, outside the kernel %.3f ms (target: <= 0.3 ms)"
                % (wall, kernel, wall - kernel))
            for line in lines[-3:]:
                say("    " + re.sub(r"^.*trace: ", "", line))
    finally:
        server.terminate()
        server.wait()
        say()
        say("## server log (last lines)")
        with open(log) as f:
            for line in f.read().splitlines()[-5:]:
                say("    " + line)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
