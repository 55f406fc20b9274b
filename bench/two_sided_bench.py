#!/usr/bin/env python3
"""Two-sided scaling through the server: one job C = diag(l)·A·diag(r)
(side="both") against two one-sided jobs (diag(l)·A, then ·diag(r)), the
way a user of the Python client would run either, in one run on one server,
with the ratio of their warm medians (target on the GPU host: <= 0.55).
Each result is checked against a float64 reference first.

  build/python-venv/bin/python bench/two_sided_bench.py --n 2000 4000 --backend cpu
  python3 bench/two_sided_bench.py --build build --n 10000 20000      # GPU host
"""

import argparse
import datetime
import os
import platform
import sys

import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess  # noqa: E402
from user_path_bench import median_ms  # noqa: E402  (bench/, beside this file)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--n", type=int, nargs="+", default=[2000, 4000])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--backend", default="auto")
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    import dgmm
    dtype = np.dtype(args.dtype)
    server = ServerProcess(binary=os.path.join(build, "service", "dgmm-server"),
                           flags=["--allow_regions"], backend=args.backend)
    try:
        client = dgmm.Client(server.address)
        print("# Two-sided scaling: one job against two")
        print()
        print("- date: %s, host %s, %d CPUs" % (
            datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            platform.node(), os.cpu_count()))
        print("- command: `%s`" % " ".join(sys.argv))
        print("- server: `dgmm-server --allow_regions --backend=%s`; the Python client's "
              "defaults (same host: process memory); %s, row-major; ms, medians of %d"
              % (args.backend, dtype.name, args.reps))
        print()
        print("| N | one job, side both | two one-sided jobs | ratio | target <= 0.55 | mode |")
        print("|---|---|---|---|---|---|")
        for n in args.n:
            rng = np.random.default_rng(n)
            a = rng.uniform(-4, 4, (n, n)).astype(dtype)
            left = rng.uniform(-4, 4, n).astype(dtype)
            right = rng.uniform(-4, 4, n).astype(dtype)
            c = np.empty_like(a)
            tmp = np.empty_like(a)
            want = left.astype(np.float64)[:, None] * a.astype(np.float64) * right.astype(
                np.float64)[None, :]

            def both():
                return client.multiply(a, (left, right), side="both", out=c, return_info=True)

            def two():
                client.multiply(a, left, side="left", out=tmp)
                client.multiply(tmp, right, side="right", out=c)

            for run in (both, two):
                c[...] = np.nan
                run()
                err = np.max(np.abs(c - want) / np.maximum(np.abs(want), 1e-30))
                if not err <= 4 * np.finfo(dtype).eps:
                    raise SystemExit("%s: max relative error %.3g" % (run.__name__, err))
            _, info = both()
            one_ms = median_ms(both, args.reps)
            two_ms = median_ms(two, args.reps)
            ratio = one_ms / two_ms
            print("| %d | %.1f | %.1f | %.2f | %s | %s%s |" % (
                n, one_ms, two_ms, ratio, "MET" if ratio <= 0.55 else "MISSED", info.mode,
                " process" if info.process_memory else ""), flush=True)
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
