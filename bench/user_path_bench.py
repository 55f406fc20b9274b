#!/usr/bin/env python3
"""The user's path: one float32 job C = A·diag(d), N x N, as a user
with NumPy arrays or .npy files on the server's host runs it, next to what
that user would run instead. Every row has its ratio to NumPy `A*d` measured
in the same run, and dgmm's rows are timed as a first job (cold: a new
client, its connection and same-host set-up included) and as later ones
(warm). The server is a separate process started here with --allow_regions.

Rows:
  numpy A*d               in this process (a new array per call)
  numpy .npy files        np.load(A.npy), np.load(d.npy), A*d, np.save(C.npy)
  cupy pageable / pinned  H2D, A*d[None, :], D2H (GPU only, CuPy importable)
  PCIe duplex floor       H2D and D2H of the matrix at once on two streams
  python socket / shm     dgmm.Client(same_host=False|True).multiply(a, d, out=c); shm is
                          the default: process memory when the server grants it (it
                          reads A from and writes C into the caller's arrays)
  python shm staging      the same with process_memory=False: a staging region and
                          the client's copies in and out
  python dgmm.empty       a and c from dgmm.empty (region memory): client.multiply(a, d,
                          out=c) copies nothing; cold = the arrays' first job
  c++ socket / shm        dgmm::Client::Multiply (dgmm_cpp_client_timing)
  c++ shm, dgmm::HostVector  the same with A and C allocated as dgmm::HostVector does
                          (transparent huge pages, as NumPy's large arrays are)
  c++ shm staging         ClientOptions.process_memory = false
  c++ shm staging 4 blocks  and same_host_blocks = 4: four region jobs of a quarter of
                          the lines each, overlapped with the copies in and out
  cli .npy socket / shm   dgmm-cli multiply --matrix A.npy --diag d.npy --out C.npy
                          (--shm=off, or the default: the files mapped and the server
                          copying between them), a process per job
  cli .npy shm staging    the same with --process_memory=false (A read into a region,
                          C written from it)
  cli .npy shm new file   the default with no C.npy before each run (the rows above
                          overwrite the C.npy of the run before, in place)
  region reused           a region registered once, the data living in it
                          (client.multiply_region), the engine's best case
  ... pinned              dgmm.empty and region reused once the server has pinned the
                          regions (GetRegionStatus.pinned; a GPU server pins a host region
                          in the background after its second job): the steady state of
                          memory that is reused, median of max(reps, 7) jobs

Targets (on the GPU host at N = 10000 and 20000): Python shm warm
<= 0.33 x NumPy and faster than CuPy pageable; Python dgmm.empty warm <= 1.15
x the PCIe duplex floor; dgmm-cli .npy (default flags) <= 0.8 x NumPy load +
multiply + save; C++ shm warm <= 0.25 x NumPy; a first shm job no slower
than a first socket job (Python, C++; every host); CPU backend: C++ shm warm
<= 1.0 x NumPy. Each printed MET or MISSED with its ratio. Then the C++
client's same-host phases (setup, copy in, job, copy out) of its first and
a warm job, and dgmm-cli's phases, which say where the time went.

  build/python-venv/bin/python bench/user_path_bench.py --n 1000 2000 --backend cpu
  python3 bench/user_path_bench.py --n 4000 10000 20000 --build .gpu/build   # GPU host
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess  # noqa: E402


def import_dgmm(build):
    staged = os.path.join(build, "python")
    if os.path.isdir(os.path.join(staged, "dgmm")):
        sys.path.insert(0, staged)
    import dgmm  # noqa: F401
    return sys.modules["dgmm"]


def commit():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def median_ms(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def check(c, a, d):
    want = a.astype(np.float64) * d.astype(np.float64)
    err = np.max(np.abs(c.astype(np.float64) - want) / np.maximum(np.abs(want), 1e-30))
    if not err <= 1e-6:
        raise SystemExit("wrong result: max relative error %g" % err)


def cupy_rows(a, d, reps):
    """CuPy pageable, CuPy pinned and the duplex floor (ms), or None."""
    try:
        import cupy as cp
        import cupyx
    except ImportError:
        return None
    cp.cuda.runtime.deviceSynchronize()

    def pageable():
        ga = cp.asarray(a)
        gd = cp.asarray(d)
        out = (ga * gd[None, :]).get()
        cp.cuda.runtime.deviceSynchronize()
        return out

    check(pageable(), a, d)
    pageable_ms = median_ms(pageable, reps)
    ha = cupyx.empty_pinned(a.shape, a.dtype)
    ha[...] = a
    hc = cupyx.empty_pinned(a.shape, a.dtype)
    ga = cp.empty_like(ha)
    gc = cp.empty_like(ha)
    gd = cp.asarray(d)
    stream = cp.cuda.Stream(non_blocking=True)

    def pinned():
        with stream:
            ga.set(ha, stream=stream)
            cp.multiply(ga, gd[None, :], out=gc)
            gc.get(stream=stream, out=hc)
        stream.synchronize()

    pinned()
    check(hc, a, d)
    pinned_ms = median_ms(pinned, reps)
    up, down = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)

    def duplex():
        ga.set(ha, stream=up)
        gc.get(stream=down, out=hc)
        up.synchronize()
        down.synchronize()

    duplex()
    floor_ms = median_ms(duplex, reps)
    return pageable_ms, pinned_ms, floor_ms, duplex


def python_rows(dgmm, address, a, d, reps, same_host, process_memory=True):
    """(cold ms, warm ms, mode) of the Python client."""
    c = np.empty_like(a)
    t0 = time.perf_counter()
    client = dgmm.Client(address, same_host=same_host, process_memory=process_memory)
    _, info = client.multiply(a, d, out=c, return_info=True)
    cold = (time.perf_counter() - t0) * 1e3
    check(c, a, d)
    warm = median_ms(lambda: client.multiply(a, d, out=c), reps)
    _, info = client.multiply(a, d, out=c, return_info=True)
    client.close()
    return cold, warm, (info.mode + (" process" if info.process_memory else "") +
                        (" (%s)" % info.socket_reason if info.socket_reason else ""))


def cpp_rows(tool, address, n, reps, same_host, blocks=0, phases=None, process_memory=True,
             host_vector=False):
    env = dict(os.environ, DGMM_SAME_HOST="1" if same_host else "0",
               DGMM_SAME_HOST_BLOCKS=str(blocks),
               DGMM_PROCESS_MEMORY="1" if process_memory else "0",
               DGMM_TIMING_HUGEPAGES="1" if host_vector else "0")
    run = subprocess.run([tool, address, str(n), str(reps), "1"], capture_output=True,
                         text=True, env=env, timeout=600)
    if run.returncode != 0:
        raise SystemExit("%s: %s" % (tool, run.stderr.strip()))
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if phases is not None:
        phases.append((out.get("first_phases"), out.get("last_phases")))
    return out["first"] * 1e3, statistics.median(out["seconds"]) * 1e3, out["mode"]


def cli_rows(cli, address, files, reps, same_host, process_memory=True, new_output=False):
    a_path, d_path, c_path = files
    base = [cli, "multiply", "--matrix", a_path, "--diag", d_path, "--out", c_path,
            "--server", address] + ([] if same_host else ["--shm=off"]) + (
                [] if process_memory else ["--process_memory=false"])
    cmd = base + ["--quiet"]
    times = []
    for _ in range(reps + 1):
        if new_output and os.path.exists(c_path):
            os.unlink(c_path)  # (outside the timing)
        t0 = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        times.append((time.perf_counter() - t0) * 1e3)
        if run.returncode != 0:
            raise SystemExit("dgmm-cli: %s" % run.stderr.strip())
    if new_output and os.path.exists(c_path):
        os.unlink(c_path)
    report = subprocess.run(base, capture_output=True, text=True, timeout=600).stdout
    mode = next((line.split(None, 1)[1].split(",")[0] for line in report.splitlines()
                 if line.startswith("mode:")), "?")
    if "process memory" in report:
        mode += " process"
    phases = next((line.split(None, 1)[1] for line in report.splitlines()
                   if line.startswith("phases:")), "")
    if phases:
        mode += " [%s]" % phases
    return times[0], statistics.median(times[1:]), mode


def empty_arrays(dgmm, address, a):
    """A new client, A copied into a dgmm.empty array and a NaN-filled one
    for C."""
    client = dgmm.Client(address)
    ra = dgmm.empty(a.shape, a.dtype, client=client)
    rc = dgmm.empty(a.shape, a.dtype, client=client)
    ra[...] = a
    rc[...] = np.nan
    return client, ra, rc


def empty_rows(dgmm, address, a, d, reps):
    """(cold ms, warm ms, mode): A and C in dgmm.empty arrays; cold is their
    first job (the server maps the regions, and pins them from the second)."""
    client, ra, rc = empty_arrays(dgmm, address, a)
    t0 = time.perf_counter()
    _, info = client.multiply(ra, d, out=rc, return_info=True)
    cold = (time.perf_counter() - t0) * 1e3
    check(rc, a, d)
    warm = median_ms(lambda: client.multiply(ra, d, out=rc), reps)
    pinned = pinned_ms(client, a.nbytes, lambda: client.multiply(ra, d, out=rc), reps)
    check(rc, a, d)
    del ra, rc
    client.close()
    return (cold, warm, info.mode), (None, pinned, "shm pinned")


def empty_interleaved(dgmm, address, a, d, reps, duplex):
    """dgmm.empty jobs on pinned regions and the duplex floor's copies in
    turns, so that both see the same machine (the floor alone moved by up
    to 23% between runs a minute apart): (job ms, floor ms), medians."""
    client, ra, rc = empty_arrays(dgmm, address, a)

    def job():
        client.multiply(ra, d, out=rc)
    job()
    job()
    if not wait_pinned(client, a.nbytes):
        client.close()
        return None
    job()
    check(rc, a, d)
    jobs, floors = [], []
    for _ in range(max(reps, 9)):
        for fn, times in ((duplex, floors), (job, jobs)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    check(rc, a, d)
    del ra, rc
    client.close()
    return statistics.median(jobs), statistics.median(floors)


def wait_pinned(client, nbytes, timeout=60.0):
    """Waits until every region of at least nbytes that this uid has
    registered is pinned (the server pins a host region in the background
    once a second job uses it); False if none is or it takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        regions = [r for r in client.region_status().regions if r.byte_size >= nbytes]
        if regions and all(r.pinned for r in regions):
            return True
        time.sleep(0.05)
    return False


def pinned_ms(client, nbytes, job, reps):
    """The steady state of memory that is reused: median ms of jobs run once
    the server has pinned the regions; None where it does not pin (CPU)."""
    job()  # a second job, which asks for the pin if the first did not
    if not wait_pinned(client, nbytes):
        return None
    job()
    return median_ms(job, max(reps, 7))


def region_row(dgmm, address, a, d, reps):
    client = dgmm.Client(address)
    region = dgmm.SharedMemoryRegion(2 * a.nbytes)
    region.register(client, "bench-reused")
    ra = region.ndarray(a.shape, a.dtype)
    rc = region.ndarray(a.shape, a.dtype, offset=a.nbytes)
    ra[...] = a
    client.multiply_region(ra, d, out=rc)
    check(rc, a, d)
    warm = median_ms(lambda: client.multiply_region(ra, d, out=rc), reps)
    pinned = pinned_ms(client, 2 * a.nbytes, lambda: client.multiply_region(ra, d, out=rc), reps)
    check(rc, a, d)
    region.close()
    client.close()
    return warm, pinned


# --only: cli (dgmm-cli rows), cupy (CuPy and the floor), clients (Python and C++
# over the socket and the same host, and HostVector), staging (staging-region
# rows), empty (dgmm.empty and the reused region).
GROUPS = ("cli", "cupy", "clients", "staging", "empty")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--build", default=os.environ.get("DGMM_BUILD_DIR",
                                                          os.path.join(REPO, "build")))
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--server-flags", default="")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--out", help="also write the report here")
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=None,
                        help="run only these groups of rows (NumPy's rows always run); the "
                             "targets whose rows did not run are left out")
    args = parser.parse_args()

    def want(group):
        return args.only is None or group in args.only
    build = os.path.abspath(args.build)
    dgmm = import_dgmm(build)
    tool = os.path.join(build, "python", "dgmm_cpp_client_timing")
    cli = os.path.join(build, "client", "cpp", "dgmm-cli")
    server_bin = os.path.join(build, "service", "dgmm-server")
    lines = []

    def say(line=""):
        print(line, flush=True)
        lines.append(line)

    flags = ["--allow_regions", "--region_memory_budget=8GiB",
             "--max_region_share_percent=100"] + shlex.split(args.server_flags)
    server = ServerProcess(binary=server_bin, flags=flags, backend=args.backend)
    try:
        say("# The user's path")
        say()
        say("- date: %s" % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"))
        say("- host: %s, %d CPUs, Python %s" % (platform.node(), os.cpu_count(),
                                                 platform.python_version()))
        gpu = subprocess.run("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader",
                             shell=True, capture_output=True, text=True).stdout.strip()
        say("- gpu: %s" % (gpu or "none (CPU backend)"))
        say("- commit: %s" % (args.commit or commit()))
        say("- command: `%s`" % " ".join(shlex.quote(x) for x in sys.argv))
        say("- server: `dgmm-server %s --backend=%s`" % (" ".join(flags), args.backend))
        say("- float32, C = A·diag(d), side right; ms, medians of %d; cold = a new client's "
            "first job (its connection and same-host set-up included); CLI rows are whole "
            "processes" % args.reps)
        say()
        results = {}
        cpp_phases = {}
        for n in args.n:
            rng = np.random.default_rng(n)
            a = rng.uniform(-4, 4, (n, n)).astype(np.float32)
            d = rng.uniform(-4, 4, n).astype(np.float32)
            row = {}
            row["numpy A*d"] = (None, median_ms(lambda: a * d, args.reps), "")
            with tempfile.TemporaryDirectory(prefix="dgmm-user-path-") as tmp:
                files = tuple(os.path.join(tmp, x) for x in ("A.npy", "d.npy", "C.npy"))
                np.save(files[0], a)
                np.save(files[1], d)

                def numpy_files():
                    np.save(files[2], np.load(files[0]) * np.load(files[1]))

                row["numpy .npy files"] = (None, median_ms(numpy_files, args.reps), "")
                for same_host in ((False, True) if want("cli") else ()):
                    tag = "shm" if same_host else "socket"
                    row["cli .npy " + tag] = cli_rows(cli, server.address, files, args.reps,
                                                      same_host)
                    check(np.load(files[2]), a, d)
                if want("cli"):
                    row["cli .npy shm staging"] = cli_rows(cli, server.address, files, args.reps,
                                                           True, process_memory=False)
                    check(np.load(files[2]), a, d)
                    row["cli .npy shm new file"] = cli_rows(cli, server.address, files,
                                                            args.reps, True, new_output=True)
                    check(np.load(files[2]), a, d)
            cupy = cupy_rows(a, d, args.reps) if args.backend != "cpu" and want("cupy") else None
            if cupy is not None:
                row["cupy pageable"] = (None, cupy[0], "")
                row["cupy pinned"] = (None, cupy[1], "")
                row["PCIe duplex floor"] = (None, cupy[2], "")
            for same_host in ((False, True) if want("clients") else ()):
                tag = "shm" if same_host else "socket"
                row["python " + tag] = python_rows(dgmm, server.address, a, d, args.reps,
                                                   same_host)
                row["c++ " + tag] = cpp_rows(tool, server.address, n, args.reps, same_host,
                                             phases=cpp_phases.setdefault(n, []) if same_host
                                             else None)
            if want("clients"):
                row["c++ shm, dgmm::HostVector"] = cpp_rows(tool, server.address, n, args.reps, True,
                                                             host_vector=True)
            if want("staging"):
                row["python shm staging"] = python_rows(dgmm, server.address, a, d, args.reps, True,
                                                        process_memory=False)
                row["c++ shm staging"] = cpp_rows(tool, server.address, n, args.reps, True,
                                                  phases=cpp_phases.setdefault(n, []),
                                                  process_memory=False)
                row["c++ shm staging 4 blocks"] = cpp_rows(tool, server.address, n, args.reps, True,
                                                           blocks=4,
                                                           phases=cpp_phases.setdefault(n, []),
                                                           process_memory=False)
            if want("empty"):
                row["python dgmm.empty"], empty_pinned = empty_rows(dgmm, server.address, a, d,
                                                                    args.reps)
                reused, reused_pinned = region_row(dgmm, server.address, a, d, args.reps)
                row["region reused"] = (None, reused, "")
                if empty_pinned[1] is not None:
                    row["python dgmm.empty pinned"] = empty_pinned
                if reused_pinned is not None:
                    row["region reused pinned"] = (None, reused_pinned, "")
                if cupy is not None:
                    turns = empty_interleaved(dgmm, server.address, a, d, args.reps, cupy[3])
                    if turns is not None:
                        row["python dgmm.empty pinned, in turns with the floor"] = (
                            None, turns[0], "shm pinned")
                        row["PCIe duplex floor, in turns"] = (None, turns[1], "")
            results[n] = row
        numpy_ms = {n: results[n]["numpy A*d"][1] for n in results}
        say("| path | " + " | ".join("N=%d cold | N=%d warm | × NumPy" % (n, n) for n in results)
            + " | mode |")
        say("|---|" + "---|---|---|" * len(results) + "---|")
        names = []
        for n in results:
            names += [name for name in results[n] if name not in names]
        for name in names:
            cells = []
            mode = ""
            for n in results:
                if name not in results[n]:
                    cells.append(" |  | ")
                    continue
                cold, warm, m = results[n][name]
                mode = m or mode
                cells.append("%s | %.1f | %.2f" % ("" if cold is None else "%.1f" % cold, warm,
                                                   warm / numpy_ms[n]))
            say("| %s | %s | %s |" % (name, " | ".join(cells), mode))
        say()
        say("## Targets")
        say()
        say("| target | measured | ratio | verdict |")
        say("|---|---|---|---|")

        def target(name, value, limit, measured):
            say("| %s | %s | %.2f | %s |" % (name, measured, value,
                                             "MET" if value <= limit else "MISSED"))

        def guard(report):
            try:  # a target whose rows did not run (--only) is left out
                report()
            except (KeyError, TypeError):
                pass

        gpu_host = args.backend != "cpu" and bool(gpu)
        for n in results:
            r = results[n]
            if gpu_host and n >= 10000:
                guard(lambda: target("python shm warm <= 0.33 x NumPy, N=%d" % n,
                       r["python shm"][1] / numpy_ms[n], 0.33,
                       "%.1f vs %.1f ms" % (r["python shm"][1], numpy_ms[n])))
                guard(lambda: target("python shm warm faster than CuPy pageable, N=%d" % n,
                       r["python shm"][1] / r["cupy pageable"][1], 1.0,
                       "%.1f vs %.1f ms" % (r["python shm"][1], r["cupy pageable"][1])))
                # Warm is the steady state of arrays that are reused: the
                # server has pinned their regions (it does so in the
                # background after their second job); the jobs before the
                # pin are the "python dgmm.empty" row.
                # In turns with the floor where CuPy is there: the floor
                # alone moves between runs by more than the target's margin.
                if "python dgmm.empty pinned, in turns with the floor" in r:
                    empty = r["python dgmm.empty pinned, in turns with the floor"]
                    floor = r["PCIe duplex floor, in turns"]
                    how = "in turns with the floor"
                else:
                    empty = r.get("python dgmm.empty pinned", r.get("python dgmm.empty"))
                    floor = r.get("PCIe duplex floor")
                    how = "regions pinned"
                guard(lambda: target("python dgmm.empty warm (%s) <= 1.15 x PCIe duplex floor, "
                       "N=%d" % (how, n), empty[1] / floor[1], 1.15,
                       "%.1f vs %.1f ms" % (empty[1], floor[1])))
                guard(lambda: target("dgmm-cli .npy (default flags) <= 0.8 x NumPy load+multiply+save, N=%d" % n,
                       r["cli .npy shm"][1] / r["numpy .npy files"][1], 0.8,
                       "%.1f vs %.1f ms" % (r["cli .npy shm"][1], r["numpy .npy files"][1])))
                guard(lambda: target("dgmm-cli .npy (default flags) into a new output file <= 0.8 x "
                                     "NumPy load+multiply+save, N=%d" % n,
                       r["cli .npy shm new file"][1] / r["numpy .npy files"][1], 0.8,
                       "%.1f vs %.1f ms" % (r["cli .npy shm new file"][1],
                                            r["numpy .npy files"][1])))
                guard(lambda: target("c++ shm warm <= 0.25 x NumPy, N=%d" % n,
                       r["c++ shm"][1] / numpy_ms[n], 0.25,
                       "%.1f vs %.1f ms" % (r["c++ shm"][1], numpy_ms[n])))
            for who in ("python", "c++"):
                guard(lambda: target("%s first shm job no slower than a first socket job, N=%d" % (who, n),
                       r[who + " shm"][0] / r[who + " socket"][0], 1.0,
                       "%.1f vs %.1f ms" % (r[who + " shm"][0], r[who + " socket"][0])))
            if not gpu_host:
                guard(lambda: target("CPU backend: c++ shm warm <= 1.0 x NumPy, N=%d" % n,
                       r["c++ shm"][1] / numpy_ms[n], 1.0,
                       "%.1f vs %.1f ms" % (r["c++ shm"][1], numpy_ms[n])))
                guard(lambda: target("CPU backend: c++ shm warm, buffers from dgmm::HostVector (huge pages, "
                       "as NumPy's), <= 1.0 x NumPy, N=%d" % n,
                       r["c++ shm, dgmm::HostVector"][1] / numpy_ms[n], 1.0,
                       "%.1f vs %.1f ms" % (r["c++ shm, dgmm::HostVector"][1], numpy_ms[n])))
        say()
        say("## Where the same-host time goes (C++ client, ms)")
        say()
        say("JobResult.same_host: setup (session, staging region made and registered), copy in, "
            "the region job(s), copy out; with blocks the three overlap, so they add up to more "
            "than the job's wall time; process memory has no copies (the server's copies are "
            "in the job). server = the job's stats.total_ns (summed over blocks).")
        say()
        say("| N | run | job | setup | copy in | region job(s) | copy out | server |")
        say("|---|---|---|---|---|---|---|---|")
        for n in cpp_phases:
            for (first, last), run in zip(cpp_phases[n], ("default: process memory",
                                                          "staging region",
                                                          "staging region, 4 blocks")):
                for label, p in (("first", first), ("warm", last)):
                    if p:
                        say("| %d | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f |" % (
                            n, run, label, p["setup"] * 1e3, p["copy_in"] * 1e3,
                            p["job"] * 1e3, p["copy_out"] * 1e3, p["server"] * 1e3))
    finally:
        server.stop()
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
