#!/usr/bin/env python3
"""Where a job on pinned region memory spends its time (the dgmm.empty
target: <= 1.15 x the PCIe duplex floor). GPU host only (CuPy).

For each server configuration (a fresh dgmm-server per --config), one
region holds A and C (as dgmm.empty's arrays do); jobs run until the server
has pinned it, then --reps jobs are timed: the client's wall time of
client.multiply_region and the server's JobStats (total_ns, queue_wait_ns,
h2d/compute/d2h summed over pieces). In the same run, with CuPy:

  floor cudaHostAlloc      H2D and D2H of the whole matrix at once on two streams,
                           from and to cudaHostAlloc'd memory (the user_path floor)
  floor registered         the same from and to an mmap'd memfd registered with
                           cudaHostRegister (as the server pins a region)

  python3 bench/pinned_region_timeline.py --build .gpu/build --n 10000 \\
      --config "" --config "--cuda_tile_bytes=32MiB"
"""

import argparse
import mmap
import re
import os
import shlex
import statistics
import sys
import time

import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess  # noqa: E402


def median_ms(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def cupy_floors(n, reps):
    import cupy as cp
    import cupyx
    nbytes = n * n * 4
    ha = cupyx.empty_pinned((n, n), np.float32)
    hc = cupyx.empty_pinned((n, n), np.float32)
    ha[...] = 1.5
    ga = cp.empty((n, n), np.float32)
    gc = cp.empty((n, n), np.float32)
    up, down = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)

    def duplex(src, dst):
        def run():
            ga.set(src, stream=up)
            gc.get(stream=down, out=dst)
            up.synchronize()
            down.synchronize()
        return run

    out = {}
    run = duplex(ha, hc)
    run()
    out["floor cudaHostAlloc"] = median_ms(run, reps)
    # Registered: an mmap'd memfd, as a dgmm region.
    fd = os.memfd_create("dgmm-floor")
    os.ftruncate(fd, 2 * nbytes)
    mem = mmap.mmap(fd, 2 * nbytes)
    ra = np.frombuffer(mem, np.float32, n * n, 0).reshape(n, n)
    rc = np.frombuffer(mem, np.float32, n * n, nbytes).reshape(n, n)
    ra[...] = 1.5
    rc[...] = 0
    ptr = ra.ctypes.data
    cp.cuda.runtime.hostRegister(ptr, 2 * nbytes, 0)
    try:
        run = duplex(ra, rc)
        run()
        out["floor registered"] = median_ms(run, reps)
    except Exception as e:  # a floor that fails is reported, the dgmm rows still run
        out["(CuPy registered/chunked failed: %s)" % e] = (float("nan"), float("nan"))
    finally:
        cp.cuda.runtime.hostUnregister(ptr)
        del ra, rc
        os.close(fd)  # the mapping goes with the process (NumPy views export it)
    return out


TRACE = re.compile(r"trace: job of (\d+) bytes: set-up ([\d.]+) ms, until the pipeline "
                   r"([\d.]+) ms, pipeline ([\d.]+) ms \((\d+) pieces\), until tear-down "
                   r"([\d.]+) ms, tear-down ([\d.]+) ms")


def traced(log, reps):
    """Medians of the last `reps` jobs' DGMM_TRACE_JOBS lines (CUDA job
    contexts): set-up, until the pipeline, pipeline, pieces, until tear-down,
    tear-down; None without them."""
    found = [m.groups()[1:] for m in TRACE.finditer(log)][-reps:]
    if not found:
        return None
    return [statistics.median(float(x[i]) for x in found) for i in range(6)]


def dgmm_rows(dgmm, build, n, reps, flags, pin_wait=30.0):
    # NAME=VALUE words of a configuration are the server's environment.
    env = dict(f.split("=", 1) for f in flags if not f.startswith("-") and "=" in f)
    flags = [f for f in flags if f.startswith("-") or "=" not in f]
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        server = ServerProcess(binary=os.path.join(build, "service", "dgmm-server"),
                               flags=["--allow_regions", "--region_memory_budget=8GiB",
                                      "--max_region_share_percent=100"] + flags,
                               backend="auto")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        client = dgmm.Client(server.address)
        nbytes = n * n * 4
        region = dgmm.SharedMemoryRegion(2 * nbytes)
        region.register(client, "timeline")
        a = region.ndarray((n, n), np.float32)
        c = region.ndarray((n, n), np.float32, offset=nbytes)
        rng = np.random.default_rng(n)
        a[...] = rng.uniform(-4, 4, (n, n)).astype(np.float32)
        d = rng.uniform(-4, 4, n).astype(np.float32)
        client.multiply_region(a, d, out=c)
        client.multiply_region(a, d, out=c)
        deadline = time.monotonic() + pin_wait
        while time.monotonic() < deadline:
            if all(r.pinned for r in client.region_status().regions if r.name == "timeline"):
                break
            time.sleep(0.05)
        pinned = all(r.pinned for r in client.region_status().regions if r.name == "timeline")
        client.multiply_region(a, d, out=c)
        rows = []
        for _ in range(reps):
            t0 = time.perf_counter()
            st = client.multiply_region(a, d, out=c)
            wall = (time.perf_counter() - t0) * 1e3
            rows.append((wall, st.total_ns / 1e6, st.queue_wait_ns / 1e6, st.h2d_ns / 1e6,
                         st.compute_ns / 1e6, st.d2h_ns / 1e6))
        want = a[-1].astype(np.float64) * d
        err = np.max(np.abs(c[-1] - want) / np.maximum(np.abs(want), 1e-30))
        assert err <= 1e-6, err
        region.close()
        client.close()
        med = [statistics.median(col) for col in zip(*rows)]
        return pinned, med, min(r[0] for r in rows), traced(server.log(), reps)
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--n", type=int, nargs="+", default=[10000])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--config", action="append", default=None,
                   help="extra dgmm-server flags of one configuration, and NAME=VALUE words "
                        "for its environment (repeatable; --config=... when it starts with -)")
    p.add_argument("--trace", action="store_true",
                   help="start the servers with DGMM_TRACE_JOBS=1 and print their host times")
    args = p.parse_args()
    if args.trace:
        os.environ["DGMM_TRACE_JOBS"] = "1"
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    import dgmm
    configs = args.config if args.config is not None else [""]
    for n in args.n:
        print("## N=%d float32, %d MB each way, ms (median, best of %d)" % (
            n, n * n * 4 // 10**6, args.reps))
        print()
        print("| what | wall | best | server total | queue | h2d sum | compute sum | d2h sum |")
        print("|---|---|---|---|---|---|---|---|")
        for name, (med, best) in cupy_floors(n, args.reps).items():
            print("| %s | %.2f | %.2f | | | | | |" % (name, med, best))
        traces = []
        for flags in configs:
            pinned, med, best, trace = dgmm_rows(dgmm, build, n, args.reps, shlex.split(flags))
            name = "`%s`%s" % (flags or "(defaults)", "" if pinned else " (NOT pinned)")
            print("| dgmm region job %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
                name, med[0], best, med[1], med[2], med[3], med[4], med[5]), flush=True)
            if trace is not None:
                traces.append((name, trace))
        print()
        if traces:
            print("Server host time of the same jobs (DGMM_TRACE_JOBS=1; medians, ms): the "
                  "CUDA job context's set-up (device memory, diagonal upload, events), host "
                  "work between set-up and the first piece, the pipeline (first piece "
                  "enqueued to last piece done), host work until the context is destroyed, "
                  "its tear-down.")
            print()
            print("| config | set-up | until pipeline | pipeline | pieces | until tear-down "
                  "| tear-down |")
            print("|---|---|---|---|---|---|---|")
            for name, t in traces:
                print("| %s | %.3f | %.3f | %.3f | %d | %.3f | %.3f |" % (
                    name, t[0], t[1], t[2], t[3], t[4], t[5]))
            print()


if __name__ == "__main__":
    main()
