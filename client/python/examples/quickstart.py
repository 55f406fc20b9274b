"""Scale the columns, then the rows, of a matrix on a dgmm server.

Usage: PYTHONPATH=client/python /usr/bin/python3 client/python/examples/quickstart.py [HOST:PORT]
"""
import sys

import numpy as np

import dgmm

address = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
rng = np.random.default_rng(0)

with dgmm.Client(address) as client:
    print("health:", client.health())                  # SERVING

    a = rng.standard_normal((1000, 300))               # float64, C order
    d = rng.standard_normal(300)
    c = client.multiply(a, d)                          # C = A·diag(d)
    assert np.allclose(c, a * d)

    f = np.asfortranarray(a, dtype=np.float32)         # float32, Fortran order
    e = rng.standard_normal(1000).astype(np.float32)
    c, stats = client.multiply(f, e, side="left", return_stats=True)  # C = diag(e)·A
    assert c.dtype == np.float32 and c.flags.f_contiguous
    assert np.allclose(c, e[:, None] * f, rtol=1e-6)
    print("left, float32: ran on %s in %.3f ms" % (stats.device, stats.total_ns / 1e6))

    big = rng.standard_normal((3000, 3000))            # 72 MB: sent as a stream of blocks
    c = client.multiply(big, d.repeat(10), stream=True)
    assert np.allclose(c, big * d.repeat(10))

    try:
        client.multiply(a, d[:10])                     # wrong diagonal length
    except dgmm.DgmmError as error:
        print("rejected:", error.code.name, "-", error.details)
