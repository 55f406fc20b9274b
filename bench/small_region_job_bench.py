#!/usr/bin/env python3
"""small_region_job_bench: the latency of a small same-host job on
dgmm.empty arrays (Python client, MultiplyRegion on the arrays' regions),
for one or more dgmm-server binaries in turns (an A/B of the server), on
the CPU backend (or --backend). Prints the median wall per job, the
server's own total (JobStats.total_ns: from the call's arrival to the job's
end), the rest (the RPC outside the server's total and the client), and the
server's thread switches per job, per binary and round; checks every result
against a float64 reference.

    build/python-venv/bin/python bench/small_region_job_bench.py \\
        --server-bin OLD --server-bin NEW --n 16 100 --rounds 3
"""
import argparse
import os
import re
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))

import numpy as np  # noqa: E402

import dgmm  # noqa: E402
from dgmm_server import ServerProcess  # noqa: E402
from pinned_region_timeline import traced as cuda_traced  # noqa: E402  (this folder)


PHASES = ("arrival to Begin", "intake", "admission to Run", "Run to the tile's end", "End",
          "stage released")
REGION_TRACE = re.compile(r"trace: region job of \d+ bytes: " + ", ".join(
    re.escape(p) + r" ([\d.]+) ms" for p in PHASES))


def traced(log, jobs):
    """Medians (ms) of the last `jobs` region-job trace lines, and the CUDA
    job contexts' (pinned_region_timeline.traced: set-up, until the
    pipeline, pipeline, pieces, until tear-down, tear-down), each None
    without such lines."""
    found = [m.groups() for m in REGION_TRACE.finditer(log)][-jobs:]
    region = ([statistics.median(float(x[i]) for x in found) for i in range(len(PHASES))]
              if found else None)
    return region, cuda_traced(log, jobs)


def switches(pid):
    total = 0
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/status" % (pid, t)) as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except FileNotFoundError:
            pass
    return total


def one(binary, n, jobs, backend, trace=False):
    server = ServerProcess(binary=binary, flags=["--allow_regions"], backend=backend)
    try:
        client = dgmm.Client(server.address)
        rng = np.random.default_rng(n)
        a = dgmm.empty((n, n), np.float32, client=client)
        a[...] = rng.uniform(-4, 4, (n, n))
        out = dgmm.empty((n, n), np.float32, client=client)
        d = rng.uniform(-4, 4, n).astype(np.float32)
        for _ in range(100):
            client.multiply(a, d, out=out)
        walls, totals = [], []
        s0 = switches(server.process.pid)
        for _ in range(jobs):
            out[...] = np.nan
            t0 = time.perf_counter()
            _, stats = client.multiply(a, d, out=out, return_stats=True)
            walls.append(time.perf_counter() - t0)
            totals.append(stats.total_ns / 1e3)
        per_job = (switches(server.process.pid) - s0) / jobs
        want = a.astype(np.float64) * d
        err = np.max(np.abs(out - want) / np.maximum(np.abs(want), 1e-30))
        if not err <= 1e-6:
            raise SystemExit("wrong result from %s: relative error %g" % (binary, err))
        client.close()
        phases = traced(server.log(), jobs) if trace else None
        return statistics.median(walls) * 1e6, statistics.median(totals), per_job, phases
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server-bin", action="append",
                   help="dgmm-server binary (repeat for an A/B; default build/service/dgmm-server)")
    p.add_argument("--n", type=int, nargs="+", default=[16, 100])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=1500)
    p.add_argument("--backend", default="cpu", help="the server's --backend (cpu, auto, cuda)")
    p.add_argument("--trace", action="store_true",
                   help="start the servers with DGMM_TRACE_JOBS=1 and print the medians of "
                        "their region-job (and CUDA job context) phases")
    args = p.parse_args()
    bins = args.server_bin or [os.path.join(REPO, "build", "service", "dgmm-server")]
    if args.trace:
        os.environ["DGMM_TRACE_JOBS"] = "1"  # the servers inherit it
    traces = []
    print("| round | server | backend | N | median us/job | server's total (JobStats) us | outside the server's total us | server switches/job |")
    print("|---|---|---|---|---|---|---|---|")
    for r in range(1, args.rounds + 1):
        for b in bins:
            for n in args.n:
                wall, total, sw, phases = one(b, n, args.jobs, args.backend, args.trace)
                print("| %d | %s | %s | %d | %.0f | %.0f | %.0f | %.1f |"
                      % (r, b, args.backend, n, wall, total, wall - total, sw), flush=True)
                if phases is not None:
                    traces.append((r, b, n, phases))
    if traces:
        print("\nServer-side phases (DGMM_TRACE_JOBS=1), medians in us: the region job's, "
              "then the CUDA job context's where there is one\n")
        cuda_columns = ("CUDA set-up", "until the pipeline", "pipeline", "pieces",
                        "until tear-down", "tear-down")
        print("| round | server | N | " + " | ".join(PHASES + cuda_columns) + " |")
        print("|" + "---|" * (3 + len(PHASES) + len(cuda_columns)))
        for r, b, n, (region, cuda) in traces:
            cells = ["%.0f" % (v * 1e3) for v in (region or [float("nan")] * len(PHASES))]
            cells += ["%.0f" % (v if i == 3 else v * 1e3)
                      for i, v in enumerate(cuda or [float("nan")] * len(cuda_columns))]
            print("| %d | %s | %d | %s |" % (r, b, n, " | ".join(cells)))


if __name__ == "__main__":
    main()
