#!/usr/bin/env python3
"""A host region's first job, with and without pinning at registration, in
one run (issue "One job path": a first job needs no pinning and is no slower
than pinning at registration was).

For each N (float32 N x N, A and C in one fresh shared-memory region, d
inline) and each server (--region_pin=register: the old rule, pinned while
RegisterRegion runs; --region_pin=reuse: the new rule, a first job through
the GPU's own pinned staging, pinned in the background on reuse), --trials
times on a fresh region:
  register   the client's wall time for RegisterRegion
  first      the first job's wall time
  second     the second job (the pin on reuse starts with it)
  pinned     a job once the server reports the region pinned (median of 5)
Every result is checked against a float64 reference (C poisoned with NaN).

Prints, per N, the medians and the ratio
  (register + first job, reuse) / (register + first job, register)
as MET when <= 1.0 (no slower than today's first job) or MISSED.

  bench/region_first_job.py --server BUILD/service/dgmm-server \\
      [--sizes 4000,10000,20000] [--trials 3] [--backend auto]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess  # noqa: E402
sys.path.insert(0, os.path.join(REPO, "client", "python"))
import dgmm  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def check(c, a, d):
    want = a.astype(np.float64) * d.astype(np.float64)
    if not np.allclose(c, want, rtol=1e-6, atol=0):
        raise SystemExit("region_first_job: a wrong result")


def trial(client, n, rng, name, gpu):
    nbytes = n * n * 4
    shm = dgmm.SharedMemoryRegion(2 * nbytes)
    a = shm.ndarray((n, n), np.float32)
    c = shm.ndarray((n, n), np.float32, offset=nbytes)
    a[:] = rng.random((n, n), dtype=np.float32) * 8 - 4
    d = rng.random(n, dtype=np.float32) * 8 - 4
    row = {}
    try:
        row["register"] = timed(lambda: shm.register(client, name))
        row["pinned_at_register"] = client.region_status(name).regions[0].pinned
        c[:] = np.nan
        row["first"] = timed(lambda: client.multiply_region(a, d, out=c))
        check(c, a, d)
        c[:] = np.nan
        row["second"] = timed(lambda: client.multiply_region(a, d, out=c))
        check(c, a, d)
        end = time.monotonic() + (30 if gpu else 0)  # a CPU server never pins
        while not client.region_status(name).regions[0].pinned and time.monotonic() < end:
            time.sleep(0.02)
        row["pinned_later"] = client.region_status(name).regions[0].pinned
        times = []
        for _ in range(5):
            c[:] = np.nan
            times.append(timed(lambda: client.multiply_region(a, d, out=c)))
            check(c, a, d)
        row["pinned"] = statistics.median(times)
    finally:
        shm.close()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--sizes", default="4000,10000,20000")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--backend", default="auto")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    results = {}
    print("region_first_job: sizes %s, %d trials, server %s" % (sizes, args.trials, args.server),
          flush=True)
    for rule in ("register", "reuse"):
        server = ServerProcess(args.server, ["--allow_regions", "--region_pin=" + rule],
                               backend=args.backend)
        try:
            with dgmm.Client(server.address) as client:
                gpu = any(dv.index >= 0 for dv in client.server_info().devices)
                for n in sizes:
                    trial(client, n, rng, "warm", gpu)  # first use of the server's paths
                    rows = []
                    for i in range(args.trials):
                        rows.append(trial(client, n, rng, "r%d" % i, gpu))
                        print("trial %s N=%d: %s" % (rule, n, rows[-1]), flush=True)
                    results[(rule, n)] = rows
        finally:
            server.stop()
    sys.stdout.flush()
    print("| N | rule | register ms | first job ms | register+first | second job ms "
          "| pinned job ms | pinned at register | pinned on reuse |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        print("region_first_job: sizes %s, %d trials, server %s" % (sizes, args.trials, args.server),
          flush=True)
    for rule in ("register", "reuse"):
            rows = results[(rule, n)]
            med = {k: statistics.median(r[k] for r in rows)
                   for k in ("register", "first", "second", "pinned")}
            print("| %d | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %s |" % (
                n, rule, med["register"], med["first"], med["register"] + med["first"],
                med["second"], med["pinned"], all(r["pinned_at_register"] for r in rows),
                all(r["pinned_later"] for r in rows)))
    for n in sizes:
        def total(rule):
            return statistics.median(r["register"] + r["first"] for r in results[(rule, n)])
        ratio = total("reuse") / total("register")
        print("N=%d: (register + first job) reuse / register = %.3f  %s" % (
            n, ratio, "MET" if ratio <= 1.0 else "MISSED"))


if __name__ == "__main__":
    main()
