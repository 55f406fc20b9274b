#!/usr/bin/env python3
"""Regions benchmark: what one float32 job costs a client on the
server's host, side by side, in one run.

For each N (an N x N float32 matrix A and a diagonal d, C = A·diag(d), the
data starting in host memory and the result wanted there unless said
otherwise), the median of --reps timed runs after a warm-up of:

  dgmm host region   Client.multiply_region on NumPy views of registered
                     shared memory (A and C in two regions; d inline)
  dgmm IPC           Client.multiply_region on CuPy arrays registered with
                     CUDA IPC (data and result on the GPU)               [gpu]
  dgmm socket        Client.multiply (today's path: unary or stream)
  CuPy pinned        in this process: H2D, kernel, D2H from and to pinned
                     host buffers, one stream                            [gpu]
  CuPy pageable      the same from and to ordinary NumPy arrays           [gpu]
  NumPy A*d          in this process: `A * d` (a new array, as users write it)
  NumPy out=         in this process: numpy.multiply(A, d, out=C)
  duplex floor       pinned H2D of A's bytes and D2H of C's on two streams at
                     once: what PCIe allows a job that must move both  [gpu]
  kernel             CuPy's elementwise A*d on the device, CUDA events     [gpu]

The client is this process; dgmm-server is a separate process it starts
(--allow_regions). Registration (map and pin, or IPC open) is a one-time cost
and reported separately: the client's wall time for RegisterRegion and the
server's RegionStatus.register_ns. Every dgmm result is checked against a
float64 reference on fresh random data (the output poisoned with NaN first).

Targets, printed as ratios with MET or MISSED:
  gpu: host-region job at N=10000 <= 1.25 x the duplex floor, and faster
       than CuPy pinned; IPC job <= kernel + 0.2 ms (at every N).
  cpu: a region job at N=4000 no slower than NumPy A*d in the client process.

Writes region_bench.md, region_bench.json and region_bench.png (when
matplotlib is importable; else the .md says the plot was skipped) to --out.

  bench/region_bench.py --server BUILD/service/dgmm-server --mode gpu|cpu \\
      [--sizes 4000,10000,20000] [--reps 7] [--out DIR] [--commit SHA]
      [-- extra dgmm-server flags]
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess, reference, tolerance  # noqa: E402
# The installed package (pip install ./client/python), else the build's staged one.
sys.path.append(os.environ.get("DGMM_PY_STAGE") or os.path.join(REPO, "build", "python"))
import dgmm  # noqa: E402

PATHS = [  # (key, label, unit of work it includes)
    ("region", "dgmm host region"),
    ("ipc", "dgmm IPC"),
    ("socket", "dgmm socket"),
    ("cupy_pinned", "CuPy pinned"),
    ("cupy_pageable", "CuPy pageable"),
    ("numpy", "NumPy A*d"),
    ("numpy_out", "NumPy out="),
    ("duplex", "duplex floor"),
    ("kernel", "kernel"),
]


def median_ms(samples):
    return statistics.median(samples) * 1e3


def timed(fn, reps, warmup=1):
    """Median wall seconds of fn() over reps runs, after warmup runs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def timed_rpc(fn, reps, warmup=1):
    """(median wall ms, median server total_ns in ms) of fn() -> JobStats."""
    for _ in range(warmup):
        fn()
    walls, totals = [], []
    for _ in range(reps):
        start = time.perf_counter()
        stats = fn()
        walls.append(time.perf_counter() - start)
        totals.append(stats.total_ns / 1e9)
    return median_ms(walls), median_ms(totals)


class Server(ServerProcess):
    """dgmm-server with --allow_regions, a separate process, on an ephemeral
    loopback port (CUDA start-up can take a while: 120 s)."""

    def __init__(self, binary, flags):
        super().__init__(binary, ["--allow_regions", *flags], backend=None, start_timeout=120,
                         stop_timeout=30, prefix="dgmm-region-bench-")


def check(c, a, d, what, rows=None):
    """c against float64 a*d (rows: a sample of row indices for big N)."""
    idx = slice(None) if rows is None else rows
    want = reference(a[idx], d, "right")
    got = np.asarray(c[idx], dtype=np.float64)
    rtol = tolerance(np.float32)
    if not np.allclose(got, want, rtol=rtol, atol=0) or np.isnan(got).any():
        bad = np.argwhere(~np.isclose(got, want, rtol=rtol, atol=0))[:3]
        raise SystemExit("region_bench: %s gave wrong results, e.g. at %s" % (what, bad.tolist()))


def sample_rows(n, rng):
    return np.unique(np.concatenate([[0, n - 1], rng.integers(0, n, 64)]))


def bench_size(n, args, client, rng, gpu, log):
    row = {"n": n, "bytes": n * n * 4}
    nbytes = n * n * 4
    rows = None if n <= 4000 else sample_rows(n, rng)
    a_src = rng.uniform(-4, 4, (n, n)).astype(np.float32)
    d = rng.uniform(-4, 4, n).astype(np.float32)

    # dgmm through host regions: A and C in two registered regions.
    shm_a, shm_c = dgmm.SharedMemoryRegion(nbytes), dgmm.SharedMemoryRegion(nbytes)
    a = shm_a.ndarray((n, n), np.float32)
    c = shm_c.ndarray((n, n), np.float32)
    a[:] = a_src
    c[:] = np.nan
    start = time.perf_counter()
    shm_a.register(client, "bench-a")
    shm_c.register(client, "bench-c")
    row["register_host_ms"] = (time.perf_counter() - start) * 1e3
    row["register_host_server_ms"] = (shm_a.status.register_ns +
                                      shm_c.status.register_ns) / 1e6
    row["pinned"] = bool(shm_a.status.pinned)
    stats = client.multiply_region(a, d, out=c)  # warm-up, checked
    check(c, a_src, d, "dgmm host region", rows)
    row["region"], row["region_server_total_ms"] = timed_rpc(
        lambda: client.multiply_region(a, d, out=c), args.reps, warmup=0)
    row["region_device"] = stats.device
    start = time.perf_counter()
    shm_a.close()
    shm_c.close()
    row["close_host_ms"] = (time.perf_counter() - start) * 1e3
    del a, c
    log("N=%d host region %.3f ms (register %.1f ms)" % (n, row["region"],
                                                         row["register_host_ms"]))

    # dgmm over the socket (the existing client: unary or stream by size).
    out = client.multiply(a_src, d)
    check(out, a_src, d, "dgmm socket", rows)
    del out
    socket_reps = args.reps if n <= 10000 else max(3, args.reps // 2)
    row["socket"] = median_ms(timed(lambda: client.multiply(a_src, d), socket_reps, warmup=0))
    log("N=%d socket %.3f ms" % (n, row["socket"]))

    # NumPy in this process.
    row["numpy"] = median_ms(timed(lambda: a_src * d, args.reps))
    out = np.empty_like(a_src)
    row["numpy_out"] = median_ms(timed(lambda: np.multiply(a_src, d, out=out), args.reps))
    del out
    log("N=%d numpy %.3f ms, out= %.3f ms" % (n, row["numpy"], row["numpy_out"]))

    if gpu:
        bench_gpu(n, args, client, rng, a_src, d, rows, row, log)
    return row


def bench_gpu(n, args, client, rng, a_src, d, rows, row, log):
    import cupy

    nbytes = n * n * 4
    stream = cupy.cuda.Stream(non_blocking=True)
    d_a = cupy.asarray(a_src)
    d_c = cupy.full((n, n), cupy.nan, dtype=cupy.float32)
    d_d = cupy.asarray(d)

    # The kernel alone, with CUDA events.
    def kernel_ms():
        begin, end = cupy.cuda.Event(), cupy.cuda.Event()
        with stream:
            begin.record(stream)
            cupy.multiply(d_a, d_d, out=d_c)
            end.record(stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(begin, end)

    for _ in range(3):
        kernel_ms()
    row["kernel"] = statistics.median(kernel_ms() for _ in range(max(args.reps, 20)))
    check(cupy.asnumpy(d_c), a_src, d, "CuPy kernel", rows)

    # dgmm through CUDA IPC: A and C stay on the GPU.
    d_c.fill(cupy.nan)
    cupy.cuda.runtime.deviceSynchronize()
    ipc_a, ipc_c = dgmm.CudaIpcRegion(d_a), dgmm.CudaIpcRegion(d_c)
    start = time.perf_counter()
    ipc_a.register(client, "bench-ipc-a")
    ipc_c.register(client, "bench-ipc-c")
    row["register_ipc_ms"] = (time.perf_counter() - start) * 1e3
    row["register_ipc_server_ms"] = (ipc_a.status.register_ns + ipc_c.status.register_ns) / 1e6
    stats = client.multiply_region(d_a, d, out=d_c)
    check(cupy.asnumpy(d_c), a_src, d, "dgmm IPC", rows)
    row["ipc"], row["ipc_server_total_ms"] = timed_rpc(
        lambda: client.multiply_region(d_a, d, out=d_c), max(args.reps, 20), warmup=2)
    row["ipc_server_compute_ms"] = stats.compute_ns / 1e6
    ipc_a.close()
    ipc_c.close()
    log("N=%d kernel %.3f ms, IPC %.3f ms" % (n, row["kernel"], row["ipc"]))

    # CuPy from pinned host memory: H2D, kernel, D2H on one stream.
    pin_a_mem = cupy.cuda.alloc_pinned_memory(nbytes)
    pin_c_mem = cupy.cuda.alloc_pinned_memory(nbytes)
    pin_a = np.frombuffer(pin_a_mem, np.float32, n * n).reshape(n, n)
    pin_c = np.frombuffer(pin_c_mem, np.float32, n * n).reshape(n, n)
    pin_a[:] = a_src
    pin_c[:] = np.nan

    def cupy_job(src, dst):
        d_a.set(src, stream=stream)
        with stream:
            cupy.multiply(d_a, d_d, out=d_c)
        d_c.get(stream=stream, out=dst)
        stream.synchronize()

    cupy_job(pin_a, pin_c)
    check(pin_c, a_src, d, "CuPy pinned", rows)
    row["cupy_pinned"] = median_ms(timed(lambda: cupy_job(pin_a, pin_c), args.reps))
    page_c = np.full((n, n), np.nan, np.float32)
    cupy_job(a_src, page_c)
    check(page_c, a_src, d, "CuPy pageable", rows)
    row["cupy_pageable"] = median_ms(timed(lambda: cupy_job(a_src, page_c), args.reps))
    del page_c
    log("N=%d CuPy pinned %.3f ms, pageable %.3f ms" % (n, row["cupy_pinned"],
                                                        row["cupy_pageable"]))

    # The duplex floor: H2D of A's bytes and D2H of C's at once, two streams.
    up, down = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    pin_a_ptr = ctypes.c_void_p(pin_a.ctypes.data)  # CuPy's async copies take c_void_p.
    pin_c_ptr = ctypes.c_void_p(pin_c.ctypes.data)

    def duplex():
        d_a.data.copy_from_host_async(pin_a_ptr, nbytes, stream=up)
        d_c.data.copy_to_host_async(pin_c_ptr, nbytes, stream=down)
        up.synchronize()
        down.synchronize()

    row["duplex"] = median_ms(timed(duplex, args.reps))

    def one_way(h2d):
        if h2d:
            d_a.data.copy_from_host_async(pin_a_ptr, nbytes, stream=up)
            up.synchronize()
        else:
            d_c.data.copy_to_host_async(pin_c_ptr, nbytes, stream=down)
            down.synchronize()

    row["h2d"] = median_ms(timed(lambda: one_way(True), args.reps))
    row["d2h"] = median_ms(timed(lambda: one_way(False), args.reps))
    log("N=%d duplex %.3f ms (H2D %.3f, D2H %.3f)" % (n, row["duplex"], row["h2d"], row["d2h"]))
    del pin_a, pin_c, pin_a_mem, pin_c_mem, d_a, d_c, d_d
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


def verdict(ok):
    return "MET" if ok else "MISSED"


def targets(rows, gpu):
    """The issue's targets as ratios, each with the measured breakdown that
    explains it (where the time went), MET or MISSED."""
    by_n = {r["n"]: r for r in rows}
    out = []

    def goal(target, measured, ratio, limit, ok, why):
        out.append({"target": target, "measured": measured, "ratio": ratio, "limit": limit,
                    "verdict": verdict(ok), "why": why})

    if gpu:
        r = by_n.get(10000)
        if r and "region" in r and "duplex" in r:
            rpc = r["region"] - r["region_server_total_ms"]
            ratio = r["region"] / r["duplex"]
            goal("host-region job at N=10000 <= 1.25 x duplex floor",
                 "%.3f ms vs %.3f ms" % (r["region"], r["duplex"]), ratio, 1.25, ratio <= 1.25,
                 "server %.3f ms + RPC and client %.3f ms; the floor moves the same bytes both "
                 "ways at once on two streams (one way: H2D %.3f ms, D2H %.3f ms)"
                 % (r["region_server_total_ms"], rpc, r["h2d"], r["d2h"]))
            ratio = r["region"] / r["cupy_pinned"]
            goal("host-region job at N=10000 faster than CuPy pinned",
                 "%.3f ms vs %.3f ms" % (r["region"], r["cupy_pinned"]), ratio, 1.0, ratio < 1.0,
                 "CuPy runs H2D, kernel and D2H one after another on one stream (H2D %.3f + "
                 "kernel %.3f + D2H %.3f = %.3f ms); the engine overlaps them over tiles"
                 % (r["h2d"], r["kernel"], r["d2h"], r["h2d"] + r["kernel"] + r["d2h"]))
        for r in rows:
            if "ipc" in r:
                margin = r["ipc"] - r["kernel"]
                goal("IPC job at N=%d <= kernel + 0.2 ms" % r["n"],
                     "%.3f ms vs kernel %.3f ms (+%.3f ms)" % (r["ipc"], r["kernel"], margin),
                     r["ipc"] / (r["kernel"] + 0.2), 1.0, margin <= 0.2,
                     "server %.3f ms (compute %.3f ms) + RPC and client %.3f ms"
                     % (r["ipc_server_total_ms"], r["ipc_server_compute_ms"],
                        r["ipc"] - r["ipc_server_total_ms"]))
    else:
        r = by_n.get(4000)
        if r:
            ratio = r["region"] / r["numpy"]
            goal("CPU: region job at N=4000 no slower than NumPy A*d in the client process",
                 "%.3f ms vs %.3f ms" % (r["region"], r["numpy"]), ratio, 1.0, ratio <= 1.0,
                 "server %.3f ms + RPC and client %.3f ms; the server computes in the shared "
                 "memory on its thread pool, A*d allocates and faults in a new result on one "
                 "thread (NumPy into a preallocated out=: %.3f ms, ratio %.3f)"
                 % (r["region_server_total_ms"], r["region"] - r["region_server_total_ms"],
                    r["numpy_out"], r["region"] / r["numpy_out"]))
    return out


def markdown(meta, rows, goals, plot_note):
    lines = ["# Regions benchmark (%s)" % meta["mode"], "",
             "- date: %s" % meta["date"], "- host: %s" % meta["host"],
             "- gpu: %s" % meta["gpu"], "- commit: %s" % meta["commit"],
             "- load average at the end (1, 5, 15 min): %s" % meta["load_average"],
             "- command: `%s`" % meta["command"],
             "- server: `%s`" % meta["server_argv"],
             "- float32, C = A·diag(d); median of %d runs after a warm-up (kernel and IPC: "
             "at least 20); client and server are separate processes" % meta["reps"], ""]
    keys = [(k, label) for k, label in PATHS if any(k in r for r in rows)]
    lines.append("| N | MB | " + " | ".join(label for _, label in keys) + " |")
    lines.append("|---|---|" + "---|" * len(keys))
    for r in rows:
        lines.append("| %d | %.0f | " % (r["n"], r["bytes"] / 1e6) + " | ".join(
            "%.3f" % r[k] if k in r else "" for k, _ in keys) + " |")
    lines += ["", "All times in ms.", "", "## Registration (one-time)", "",
              "| N | host: register A and C (client wall, ms) | host: server register_ns "
              "(map%s, ms) | host: close (unregister, unlink, unmap; ms) | "
              "IPC: register (client wall, ms) | IPC: server register_ns (open, ms) |"
              % (" + pin" if any(r.get("pinned") for r in rows) else ""),
              "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %d | %.2f | %.2f | %.2f | %s | %s |" % (
            r["n"], r["register_host_ms"], r["register_host_server_ms"],
            r["close_host_ms"],
            "%.2f" % r["register_ipc_ms"] if "register_ipc_ms" in r else "-",
            "%.2f" % r["register_ipc_server_ms"] if "register_ipc_server_ms" in r else "-"))
    lines += ["", "## Targets", "", "| target | measured | ratio | limit | verdict | why |",
              "|---|---|---|---|---|---|"]
    for g in goals:
        lines.append("| %s | %s | %.3f | %.2f | %s | %s |" % (
            g["target"], g["measured"], g["ratio"], g["limit"], g["verdict"], g["why"]))
    lines += ["", plot_note, ""]
    return "\n".join(lines)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "Plot skipped: matplotlib is not installed for %s." % sys.executable
    keys = [(k, label) for k, label in PATHS if any(k in r for r in rows)]
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(keys)
    for i, (k, label) in enumerate(keys):
        xs = [j + i * width for j, r in enumerate(rows) if k in r]
        ys = [r[k] for r in rows if k in r]
        ax.bar(xs, ys, width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels(["N=%d" % r["n"] for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("ms (median, log scale)")
    ax.set_title("dgmm regions vs. socket, CuPy, NumPy and the PCIe floor (float32)")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return "Plot: region_bench.png."


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "none"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="dgmm-server binary")
    parser.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    parser.add_argument("--sizes", default=None,
                        help="N values (default gpu: 4000,10000,20000; cpu: 4000,10000)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=".")
    parser.add_argument("--commit", default=None)
    parser.add_argument("server_flags", nargs="*", help="extra dgmm-server flags (after --)")
    args = parser.parse_args()
    gpu = args.mode == "gpu"
    sizes = [int(s) for s in (args.sizes or ("4000,10000,20000" if gpu else
                                             "4000,10000")).split(",")]
    commit = args.commit or subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    os.makedirs(args.out, exist_ok=True)
    flags = ["--backend=auto" if gpu else "--backend=cpu",
             "--region_memory_budget=%dGiB" % (8 if max(sizes) <= 20000 else 32),
             "--max_region_share_percent=100", *args.server_flags]
    log_lines = []

    def log(text):
        print(text, flush=True)
        log_lines.append(text)

    if gpu:
        import cupy  # noqa: F401 - fail early without CuPy
    server = Server(args.server, flags)
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    rows = []
    try:
        with dgmm.Client(server.address) as client:
            info = client.server_info()
            if not info.limits.regions_enabled:
                raise SystemExit("region_bench: the server has regions off")
            if gpu and not any(dv.index >= 0 for dv in info.devices):
                raise SystemExit("region_bench: --mode gpu, but the server has no GPU")
            # The local-socket session, once per client: opened
            # here so that no size's register time includes it.
            client.local_session()
            for n in sizes:
                rows.append(bench_size(n, args, client, rng, gpu, log))
                if client.region_status().registered_bytes != 0:
                    raise SystemExit("region_bench: regions left registered after N=%d" % n)
    finally:
        server.stop()
    meta = {"mode": args.mode, "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": "%s, %d CPUs, %s" % (platform.node(), os.cpu_count(), platform.machine()),
            "gpu": gpu_name() if gpu else "none (CPU backend)", "commit": commit,
            "command": " ".join(shlex.quote(a) for a in ["bench/region_bench.py", *sys.argv[1:]]),
            "server_argv": " ".join(server.argv[:1] + server.argv[3:]), "reps": args.reps,
            "load_average": "%.2f %.2f %.2f" % os.getloadavg()}
    goals = targets(rows, gpu)
    plot_note = plot(rows, os.path.join(args.out, "region_bench.png"))
    text = markdown(meta, rows, goals, plot_note)
    with open(os.path.join(args.out, "region_bench.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "region_bench.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "targets": goals, "log": log_lines}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
