"""Element types through the Python client: float16, bfloat16 (ml_dtypes, where
importable), float32, float64, complex64 and complex128 matrices, diagonals
promoted into A's dtype, results of a wider dtype than A's (NumPy's
result_type of A and d: float32 A with a float64 d gives float64, a real A
with a complex d a complex C, float16 with bfloat16 float32), side="both"
with a pair (l, r), both layouts, on Multiply, MultiplyStream, striping,
MultiplyBatch, the same-host path and multiply_region, against the real
server (CPU backend).

Each result is compared bit for bit (any NaN equals any NaN) with a
reference computed here by NumPy from the definition (docs/dtypes.md):
the operands widened to the compute type (float32 for the half types),
(l·a)·r with each product and sum its own ufunc (no fused multiply-add),
then one rounding to the half type. The operands mix ordinary values,
half values whose products round, subnormals and IEEE specials.

Run by ctest (python_dtypes) with the build's venv, or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server build/python-venv/bin/python \
    tests/python/test_dtypes.py -v
"""

import os
import sys
import unittest

if __name__ == "__main__":
    try:
        import grpc  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as missing:
        print("SKIP: %s lacks a client dependency (%s)" % (sys.executable, missing))
        sys.exit(77)

import numpy as np  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess  # noqa: E402
import dgmm  # noqa: E402

try:
    import ml_dtypes
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None

SERVER = None


def setUpModule():
    global SERVER
    SERVER = ServerProcess(flags=["--threads=2"], prefix="dgmm-py-dtypes-")


def tearDownModule():
    if SERVER:
        SERVER.stop()


# ------------------------------------------------------------ the reference

def compute_dtype(dtype):
    return np.dtype(np.float32) if dtype.itemsize == 2 else dtype


def bits16(x):
    return x.view(np.uint16)


def widen(x, k):
    """x widened exactly to the compute dtype k (a real to complex gets +0i)."""
    if BFLOAT16 is not None and x.dtype == BFLOAT16:
        x = (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return x.astype(k)


def mul(x, y):
    """x·y elementwise in x's dtype, complex as (ac - bd) + (ad + bc)i with
    every product and sum a ufunc of its own (nothing fused)."""
    if x.dtype.kind != "c":
        return x * y
    a, b, c, d = x.real, x.imag, y.real, y.imag
    re = np.subtract(np.multiply(a, c), np.multiply(b, d))
    im = np.add(np.multiply(a, d), np.multiply(b, c))
    out = np.empty(np.broadcast(x, y).shape, dtype=x.dtype)
    out.real, out.imag = re, im
    return out


def to_bfloat16(f32):
    """float32 to bfloat16 patterns, to nearest, ties to even (NaN kept NaN)."""
    u = f32.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f32)
    r[nan] = (u[nan] >> 16).astype(np.uint16) | 0x0040
    return r


def expected_dtype(a_dtype, d_dtype):
    """C's dtype as NumPy gives it: np.result_type, and for bfloat16 (which
    NumPy alone does not know) ml_dtypes' rule: with itself bfloat16, with
    float16 float32, else the other type (float32 or wider)."""
    a_dtype, d_dtype = np.dtype(a_dtype), np.dtype(d_dtype)
    if BFLOAT16 is not None and BFLOAT16 in (a_dtype, d_dtype):
        other = d_dtype if a_dtype == BFLOAT16 else a_dtype
        if other == BFLOAT16:
            return BFLOAT16
        return np.dtype(np.float32) if other.itemsize == 2 else other
    return np.result_type(a_dtype, d_dtype)


def diag_dtype(d):
    return np.result_type(*(x.dtype for x in d)) if isinstance(d, tuple) else d.dtype


def reference(a, side, d):
    """C for A of dtype a.dtype: side "left"/"right" with d, "both" with d =
    (l, r), in C's dtype (expected_dtype of A and d)."""
    c_dtype = expected_dtype(a.dtype, diag_dtype(d))
    k = compute_dtype(c_dtype)
    x = widen(a, k)
    with np.errstate(all="ignore"):
        if side == "left":
            x = mul(widen(d, k)[:, None], x)
        elif side == "right":
            x = mul(widen(d, k)[None, :], x)
        else:
            l, r = d
            x = mul(mul(widen(l, k)[:, None], x), widen(r, k)[None, :])
        if c_dtype == np.float16:
            return x.astype(np.float16)  # NumPy rounds float32 to float16 to nearest, even
        if BFLOAT16 is not None and c_dtype == BFLOAT16:
            return to_bfloat16(x).view(BFLOAT16)
        return x


def same(c, want):
    """Bit for bit, any NaN equal to any NaN (per part for complex)."""
    if c.dtype.itemsize == 2:
        cu, wu = bits16(c), bits16(want)
        if c.dtype == np.float16:
            cn, wn = np.isnan(c), np.isnan(want)
        else:  # bfloat16: exponent all ones and a significand
            cn, wn = ((cu & 0x7fff) > 0x7f80), ((wu & 0x7fff) > 0x7f80)
        return bool(np.all((cu == wu) | (cn & wn)))
    parts = [(c.real, want.real), (c.imag, want.imag)] if c.dtype.kind == "c" else [(c, want)]
    for got, exp in parts:
        g = np.ascontiguousarray(got).view(np.uint32 if got.itemsize == 4 else np.uint64)
        w = np.ascontiguousarray(exp).view(g.dtype)
        if not np.all((g == w) | (np.isnan(got) & np.isnan(exp))):
            return False
    return True


# --------------------------------------------------------------- operands

def values(rng, dtype, shape):
    """Ordinary values, half values near 1 (their products round and tie),
    subnormals and specials, in `dtype`."""
    n = int(np.prod(shape))
    real = np.float32 if dtype.itemsize <= 8 and dtype.kind == "c" else np.float64

    def reals():
        x = rng.uniform(-2, 2, n)
        k = rng.integers(0, 10, n)
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8, -6e-8, 1e-40, 65504.0,
                             1e-310, 3.0e38])
        x = np.where(k == 0, specials[rng.integers(0, len(specials), n)], x)
        near_one = 1.0 + rng.integers(0, 1024, n) / 1024.0
        x = np.where(k == 1, near_one * rng.choice([-1.0, 1.0], n), x)
        return x

    with np.errstate(all="ignore"):
        if dtype.kind == "c":
            out = (reals().astype(real) + 1j * reals().astype(real)).astype(dtype)
        elif BFLOAT16 is not None and dtype == BFLOAT16:
            out = to_bfloat16(reals().astype(np.float32)).view(BFLOAT16)
        else:
            out = reals().astype(dtype)
    return out.reshape(shape)


def dtypes():
    out = [np.dtype(t) for t in ("<f2", "<f4", "<f8", "<c8", "<c16")]
    if BFLOAT16 is not None:
        out.append(BFLOAT16)
    return out


class DTypeTest(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(27)

    def check(self, client, a, side, d, what, **kwargs):
        c = client.multiply(a, d, side, **kwargs)
        self.assertEqual(c.dtype, expected_dtype(a.dtype, diag_dtype(d)), what)
        self.assertEqual(c.shape, a.shape, what)
        self.assertEqual(c.flags.f_contiguous and not c.flags.c_contiguous,
                         a.flags.f_contiguous and not a.flags.c_contiguous, what)
        want = reference(a, side, d)
        self.assertTrue(same(c, want), "%s: first mismatches %s vs %s" % (
            what, c.ravel()[:4], np.asarray(want).ravel()[:4]))

    def operands(self, dtype, d_dtype, side, order, rows=23, cols=17):
        a = values(self.rng, dtype, (rows, cols))
        a = np.asfortranarray(a) if order == "F" else a
        if side == "both":
            return a, (values(self.rng, d_dtype, (rows,)), values(self.rng, d_dtype, (cols,)))
        return a, values(self.rng, d_dtype, (rows if side == "left" else cols,))

    def test_every_dtype_side_layout_and_path(self):
        paths = [("unary", dgmm.Client(SERVER.address, same_host=False), {"stream": False}),
                 ("stream", dgmm.Client(SERVER.address, same_host=False, chunk_bytes=256),
                  {"stream": True}),
                 ("striped", dgmm.Client(SERVER.address, same_host=False), {"stripes": 3})]
        try:
            for dtype in dtypes():
                for side in ("left", "right", "both"):
                    for order in ("C", "F"):
                        for name, client, kwargs in paths:
                            a, d = self.operands(dtype, dtype, side, order)
                            self.check(client, a, side, d,
                                       "%s %s %s %s" % (dtype, side, order, name), **kwargs)
        finally:
            for _, client, _ in paths:
                client.close()

    def test_diagonals_promoted_into_the_matrix_dtype(self):
        pairs = [("<f8", "<f4"), ("<f8", "<f2"), ("<f4", "<f2"), ("<c8", "<f4"), ("<c8", "<f2"),
                 ("<c16", "<c8"), ("<c16", "<f8")]
        if BFLOAT16 is not None:
            pairs += [("<f4", BFLOAT16), ("<c16", BFLOAT16)]
        with dgmm.Client(SERVER.address, same_host=False) as client:
            for a_type, d_type in pairs:
                for side in ("right", "both"):
                    a, d = self.operands(np.dtype(a_type), np.dtype(d_type), side, "F")
                    self.check(client, a, side, d, "%s with %s d, %s" % (a_type, d_type, side))

    def test_results_of_a_wider_dtype_than_the_matrix(self):
        """C in NumPy's result_type(A, d), wider than A: on every path."""
        pairs = [("<f4", "<f8"), ("<f2", "<f4"), ("<f4", "<c8"), ("<f8", "<c8"),
                 ("<f4", "<c16"), ("<f2", "<c8")]
        if BFLOAT16 is not None:
            pairs += [("<f2", BFLOAT16), (BFLOAT16, "<f2"), (BFLOAT16, "<c16")]
        paths = [("unary", dgmm.Client(SERVER.address, same_host=False), {"stream": False}),
                 ("stream", dgmm.Client(SERVER.address, same_host=False, chunk_bytes=256),
                  {"stream": True}),
                 ("striped", dgmm.Client(SERVER.address, same_host=False), {"stripes": 3})]
        try:
            for a_type, d_type in pairs:
                a_type, d_type = np.dtype(a_type), np.dtype(d_type)
                if BFLOAT16 not in (a_type, d_type):
                    # The rule is NumPy's own.
                    self.assertEqual(dgmm.result_dtype(a_type, d_type),
                                     np.result_type(a_type, d_type))
                self.assertEqual(dgmm.result_dtype(a_type, d_type),
                                 expected_dtype(a_type, d_type))
                self.assertNotEqual(expected_dtype(a_type, d_type), a_type)
                for side in ("left", "right", "both"):
                    for order in ("C", "F"):
                        for name, client, kwargs in paths:
                            a, d = self.operands(a_type, d_type, side, order)
                            self.check(client, a, side, d, "%s A, %s d, %s %s %s" % (
                                a_type, d_type, side, order, name), **kwargs)
        finally:
            for _, client, _ in paths:
                client.close()

    def test_batch_of_every_dtype(self):
        jobs, wants = [], []
        for dtype in dtypes():
            for side in ("left", "both"):
                a, d = self.operands(dtype, dtype, side, "C", rows=5, cols=4)
                jobs.append((a, d, side))
                wants.append(reference(a, side, d))
        with dgmm.Client(SERVER.address, same_host=False) as client:
            results = client.multiply_batch(jobs)
        self.assertEqual(len(results), len(jobs))
        for (a, _d, side), c, want in zip(jobs, results, wants):
            self.assertNotIsInstance(c, Exception, "%s %s" % (a.dtype, side))
            self.assertEqual(c.dtype, a.dtype)
            self.assertTrue(same(c, want), "%s %s" % (a.dtype, side))

    def test_batch_and_out_of_a_wider_result(self):
        jobs = []
        for a_type, d_type, side in (("<f4", "<f8", "left"), ("<f2", "<c8", "both"),
                                     ("<f8", "<f8", "right")):
            a, d = self.operands(np.dtype(a_type), np.dtype(d_type), side, "C", rows=5, cols=4)
            jobs.append((a, d, side))
        with dgmm.Client(SERVER.address, same_host=False) as client:
            results = client.multiply_batch(jobs)
            for (a, d, side), c in zip(jobs, results):
                self.assertNotIsInstance(c, Exception, "%s %s" % (a.dtype, side))
                self.assertEqual(c.dtype, expected_dtype(a.dtype, diag_dtype(d)))
                self.assertTrue(same(c, reference(a, side, d)), "%s %s" % (a.dtype, side))
            # out= takes C of the result's dtype, poisoned first; one of A's
            # dtype is refused.
            a, d = self.operands(np.dtype("<f4"), np.dtype("<f8"), "right", "F")
            out = np.asfortranarray(np.full(a.shape, np.nan))
            c = client.multiply(a, d, "right", out=out)
            self.assertIs(c, out)
            self.assertTrue(same(out, reference(a, "right", d)))
            with self.assertRaises(ValueError) as e:
                client.multiply(a, d, "right", out=np.asfortranarray(np.empty_like(a)))
            self.assertIn("float64 array", str(e.exception))

    def test_refusals(self):
        with dgmm.Client(SERVER.address, same_host=False) as client:
            a = np.ones((3, 2), dtype=np.float32)
            with self.assertRaises(ValueError) as e:
                client.multiply(a, np.ones(2), "both")
            self.assertIn("pair (l, r)", str(e.exception))
            with self.assertRaises(ValueError) as e:
                client.multiply(np.ones((3, 2), dtype=np.int32), np.ones(2))
            self.assertIn("A must be float16, bfloat16", str(e.exception))
            # cuBLAS has no half-type dgmm: the server says so.
            with self.assertRaises(dgmm.DgmmError) as e:
                client.multiply(np.ones((3, 2), dtype=np.float16), np.ones(2, np.float16),
                                backend="cublas")
            self.assertIn("BACKEND_CUBLAS", e.exception.details)
            # A wider diagonal is no longer converted to A's dtype: C is
            # float64, as NumPy's a * d.
            c = client.multiply(a, np.array([0.1, 3.0]))
            self.assertEqual(c.dtype, np.float64)
            np.testing.assert_array_equal(c, a * np.array([0.1, 3.0]))
            # An integer diagonal is converted to A's dtype.
            c = client.multiply(a, np.array([2, 3]))
            self.assertEqual(c.dtype, np.float32)
            np.testing.assert_array_equal(c, a * np.array([2, 3], dtype=np.float32))
            # cuBLAS has no dgmm of a promoted result: the server says so.
            with self.assertRaises(dgmm.DgmmError) as e:
                client.multiply(a, np.ones(2), backend="cublas")
            self.assertIn("BACKEND_CUBLAS", e.exception.details)

    def test_region_jobs_of_every_dtype(self):
        """multiply_region on a registered SharedMemoryRegion: A and C in it
        (apart and in place), the diagonals inline or in the region too."""
        server = ServerProcess(flags=["--threads=2", "--allow_regions"],
                               prefix="dgmm-py-dtypes-regions-")
        try:
            with dgmm.Client(server.address) as client:
                for dtype in dtypes():
                    for side in ("left", "both"):
                        for order in ("C", "F"):
                            for in_place, diag_in_region in ((False, False), (True, True)):
                                what = "%s %s %s%s%s" % (dtype, side, order,
                                                          " in place" if in_place else "",
                                                          " d in region" if diag_in_region else "")
                                a0, d0 = self.operands(dtype, dtype, side, order)
                                region = dgmm.SharedMemoryRegion(1 << 16)
                                try:
                                    region.register(client, "dt-%d" % (abs(hash(what)) % 10**9))
                                    a = region.ndarray(a0.shape, dtype, order=order)
                                    a[...] = a0
                                    c = a if in_place else region.ndarray(
                                        a0.shape, dtype, offset=8192, order=order)
                                    if not in_place:  # poisoned: all ones is a NaN
                                        poison = region.ndarray((c.nbytes,), np.uint8, 8192)
                                        poison[...] = 0xff
                                    d = d0
                                    if diag_in_region:
                                        parts = d0 if side == "both" else (d0,)
                                        placed, at = [], 16384
                                        for part in parts:
                                            v = region.ndarray(part.shape, dtype, offset=at)
                                            v[...] = part
                                            placed.append(v)
                                            at += 4096
                                        d = tuple(placed) if side == "both" else placed[0]
                                    client.multiply_region(a, d, c, side=side)
                                    self.assertTrue(same(np.array(c), reference(a0, side, d0)),
                                                    what)
                                finally:
                                    region.close()
                # The raw call with both diagonals as RegionRefs.
                a0, (l0, r0) = self.operands(np.dtype("<c8"), np.dtype("<c8"), "both", "C")
                region = dgmm.SharedMemoryRegion(1 << 16)
                try:
                    region.register(client, "dt-raw")
                    a = region.ndarray(a0.shape, a0.dtype)
                    a[...] = a0
                    region.ndarray(l0.shape, l0.dtype, 16384)[...] = l0
                    region.ndarray(r0.shape, r0.dtype, 20480)[...] = r0
                    header = dgmm.pb.JobHeader(rows=a0.shape[0], cols=a0.shape[1],
                                               dtype=dgmm.pb.DTYPE_COMPLEX64,
                                               side=dgmm.pb.SIDE_BOTH)
                    client.multiply_region_refs(header, region.ref(0), region.ref(0),
                                                diagonal=region.ref(16384),
                                                right_diagonal=region.ref(20480))
                    self.assertTrue(same(np.array(a), reference(a0, "both", (l0, r0))))
                finally:
                    region.close()
        finally:
            server.stop()

    def test_region_and_same_host_jobs_of_a_wider_result(self):
        """C wider than A through memory: multiply_region with out of the
        result's dtype apart from A (in place refused), the same-host path
        (process memory, and a staging region), and dgmm arrays."""
        server = ServerProcess(flags=["--threads=2", "--allow_regions"],
                               prefix="dgmm-py-dtypes-wider-")
        try:
            with dgmm.Client(server.address) as client:
                for a_type, d_type in (("<f4", "<f8"), ("<f2", "<c16")):
                    for side in ("left", "both"):
                        for order in ("C", "F"):
                            what = "%s A, %s d, %s %s" % (a_type, d_type, side, order)
                            a0, d0 = self.operands(np.dtype(a_type), np.dtype(d_type), side, order)
                            c_dtype = expected_dtype(a0.dtype, diag_dtype(d0))
                            region = dgmm.SharedMemoryRegion(1 << 16)
                            try:
                                region.register(client, "wd-%d" % (abs(hash(what)) % 10**9))
                                a = region.ndarray(a0.shape, a0.dtype, order=order)
                                a[...] = a0
                                region.ndarray((1 << 15,), np.uint8, 8192)[...] = 0xff
                                c = region.ndarray(a0.shape, c_dtype, offset=8192, order=order)
                                stats = client.multiply_region(a, d0, c, side=side)
                                self.assertEqual(stats.bytes_out, c.nbytes, what)
                                self.assertTrue(same(np.array(c), reference(a0, side, d0)), what)
                                with self.assertRaises(ValueError) as e:
                                    client.multiply_region(a, d0, a, side=side)
                                self.assertIn("the result's dtype", str(e.exception))
                            finally:
                                region.close()
                    # The same-host path (A of 1 MiB and more): process
                    # memory by default, a staging region without it.
                    a0, d0 = self.operands(np.dtype(a_type), np.dtype(d_type), "both", "F",
                                           rows=1040, cols=513)
                    for process_memory in (True, False):
                        what = "%s A, %s d, same host%s" % (
                            a_type, d_type, "" if process_memory else ", staging region")
                        with dgmm.Client(server.address, process_memory=process_memory) as near:
                            c, info = near.multiply(a0, d0, "both", return_info=True)
                        self.assertEqual(info.mode, "shm", what)
                        self.assertEqual(info.process_memory, process_memory, what)
                        self.assertEqual(c.dtype, expected_dtype(a0.dtype, diag_dtype(d0)), what)
                        self.assertTrue(c.flags.f_contiguous, what)
                        self.assertTrue(same(c, reference(a0, "both", d0)), what)
                # dgmm arrays: a float32 A in a region with a float64 d; C is
                # float64, computed on the C++ client's path.
                a0, d0 = self.operands(np.dtype("<f4"), np.dtype("<f8"), "right", "C")
                a = dgmm.asarray(a0, client=client)
                c = client.multiply(a, d0)
                self.assertEqual(c.dtype, np.float64)
                self.assertTrue(same(c, reference(a0, "right", d0)))
        finally:
            server.stop()

    def test_server_info_lists_the_dtypes(self):
        with dgmm.Client(SERVER.address) as client:
            info = client.server_info()
        self.assertEqual(len(info.dtypes), 6)
        cpu = [c for c in info.capabilities if c.backend == dgmm.pb.BACKEND_CPU]
        self.assertEqual(len(cpu), 1)
        self.assertIn(dgmm.pb.SIDE_BOTH, cpu[0].sides)
        self.assertIn(dgmm.pb.DTYPE_BFLOAT16, cpu[0].dtypes)


if __name__ == "__main__":
    unittest.main()
