"""python_timing.py: times dgmm.Client.multiply on one N x N float32 job,
the mirror of dgmm_cpp_client_timing and node_timing.js.

    python3 python_timing.py SERVER N REPEATS [WARMUP]

Prints {"n": N, "seconds": [...], "first": t0, "mode": M}. DGMM_SAME_HOST=0
turns the same-host path off.
"""
import json
import os
import sys
import time

import numpy as np

import dgmm


def main():
    server, n, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    warmup = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    rng = np.random.default_rng()
    a = rng.uniform(-4, 4, (n, n)).astype(np.float32)
    d = rng.uniform(-4, 4, n).astype(np.float32)
    c = np.full((n, n), np.nan, dtype=np.float32)
    client = dgmm.Client(server, same_host=os.environ.get("DGMM_SAME_HOST") != "0")
    seconds, first = [], 0.0
    for i in range(warmup + repeats):
        start = time.perf_counter()
        client.multiply(a, d, side="right", out=c)
        s = time.perf_counter() - start
        if i == 0:
            first = s
            if not np.allclose(c, a * d, rtol=1e-6, atol=0):
                sys.exit(3)
        if i >= warmup:
            seconds.append(s)
    client.close()
    print(json.dumps({"n": n, "seconds": seconds, "first": first, "mode": ""}))


if __name__ == "__main__":
    main()
