"""The Python client's policy (docs/protocol.md section 9) against the real server:
thresholds, striping over separate connections, part headers (ranges, diagonal
slices, job groups), resume after a reset connection, one status per job,
backend names.

Run by ctest (test `python_client_policy`), or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server build/python-venv/bin/python \
    tests/python/test_policy.py -v
Exits 77 (ctest's skip code here) when this interpreter lacks grpcio/numpy.
"""

import os
import re
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

if __name__ == "__main__":
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as missing:
        print("SKIP: %s lacks a client dependency (%s)" % (sys.executable, missing))
        sys.exit(77)

import grpc  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "conformance"))
import dgmm  # noqa: E402
from dgmm import client as policy  # noqa: E402
from harness import ResetProxy  # noqa: E402
from test_client import Server, reference, socket_free_port, tolerance  # noqa: E402

KIB = 1 << 10
MIB = 1 << 20
SMALL = dict(max_unary_message_bytes=256 * KIB, chunk_bytes=64 * KIB)

SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server()


def tearDownModule():
    if SERVER:
        SERVER.stop()


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def poisoned(shape, dtype, order):
    return np.full(shape, np.nan, dtype=dtype, order=order)


def assert_exact(test, c, a, d, side):
    test.assertFalse(np.isnan(c).any(), "lines were never filled in")
    np.testing.assert_allclose(c, reference(a, d, side), rtol=tolerance(c.dtype), atol=0)


class PolicyFunctionsTest(unittest.TestCase):
    """The pure functions (the conformance vectors check them too)."""

    def test_unary_threshold_is_min_of_chunk_and_seven_eighths_of_the_unary_limit(self):
        self.assertEqual(policy.unary_threshold(), 4 * MIB)
        self.assertEqual(policy.unary_threshold(1 * MIB, 4 * MIB), 917504)
        self.assertEqual(policy.transfer_mode(4 * MIB - 4, 4), "unary")
        self.assertEqual(policy.transfer_mode(4 * MIB - 4, 5), "stream")
        # A line longer than C: unary up to U - 64 KiB.
        self.assertEqual(policy.transfer_mode(9600000, 16, 16 * MIB, 4 * MIB, 4800000), "unary")
        self.assertEqual(policy.transfer_mode(16 * MIB - 65536, 0, 16 * MIB, 4 * MIB, 5 * MIB), "unary")
        self.assertEqual(policy.transfer_mode(16 * MIB - 65535, 0, 16 * MIB, 4 * MIB, 5 * MIB), "stream")
        self.assertEqual(policy.transfer_mode(9600000, 16, 16 * MIB, 4 * MIB, 4 * MIB), "stream")

    def test_auto_stripes_start_at_64_mib_and_stop_at_8_and_at_the_lines(self):
        self.assertEqual(policy.stripe_count(64 * MIB - 1, 4096), 1)
        self.assertEqual(policy.stripe_count(64 * MIB, 4096), 2)
        self.assertEqual(policy.stripe_count(10 * 1024 * MIB, 4096), 8)
        self.assertEqual(policy.stripe_count(10 * 1024 * MIB, 3), 3)
        self.assertEqual(policy.stripe_count(10, 100, 6), 6)
        self.assertEqual(policy.stripe_ranges(10, 4), [(0, 3), (3, 3), (6, 2), (8, 2)])
        for bad in (0, -1, 2.5, True, "2"):
            with self.subTest(stripes=bad):
                with self.assertRaises(dgmm.InvalidArgumentError):
                    policy.stripe_count(10, 10, bad)


class BackendNameTest(unittest.TestCase):
    def test_policy_names_and_enum_names_are_accepted(self):
        with dgmm.Client(SERVER.address) as client:
            a = np.random.default_rng(1).uniform(-4, 4, (6, 5))
            d = np.random.default_rng(2).uniform(-4, 4, 5)
            for name in ("auto", "cpu", "BACKEND_AUTO", "BACKEND_CPU", dgmm.pb.BACKEND_CPU):
                with self.subTest(backend=name):
                    np.testing.assert_array_equal(client.multiply(a, d, backend=name),
                                                  reference(a, d, "right"))
            # A valid name the CPU-only server cannot honour: the server says so.
            with self.assertRaises(dgmm.DgmmError) as raised:
                client.multiply(a, d, backend="cuda-kernel")
            self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertNotIsInstance(raised.exception, dgmm.InvalidArgumentError)

    def test_other_names_are_invalid_argument_before_any_call(self):
        with socket_free_port() as port:  # Nothing listens: a call would be UNAVAILABLE.
            with dgmm.Client("127.0.0.1:%d" % port) as client:
                for name in ("gpu", "cuda_kernel", "cuda", "CPU", "Auto", "", 7, None):
                    with self.subTest(backend=name):
                        start = time.monotonic()
                        with self.assertRaises(dgmm.DgmmError) as raised:
                            client.multiply(np.ones((2, 2)), np.ones(2), backend=name)
                        self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                        self.assertIsInstance(raised.exception, ValueError)
                        self.assertIsNone(raised.exception.info)
                        self.assertLess(time.monotonic() - start, 0.5)


class ThresholdTest(unittest.TestCase):
    def test_default_threshold_is_4_mib_of_matrix_and_diagonal(self):
        rng = np.random.default_rng(3)
        with dgmm.Client(SERVER.address) as client:
            for cols, mode in ((1023, "unary"), (1024, "stream")):
                with self.subTest(cols=cols):
                    a = rng.uniform(-4, 4, (1024, cols)).astype(np.float32)
                    d = rng.uniform(-4, 4, 1024).astype(np.float32)
                    c, info = client.multiply(a, d, side="left", return_info=True)
                    self.assertEqual((info.mode, info.stripes, info.attempts), (mode, 1, 1))
                    assert_exact(self, c, a, d, "left")


class StripingTest(unittest.TestCase):
    def setUp(self):
        self.proxy = ResetProxy(("127.0.0.1", port_of(SERVER.address)), 0, 0)
        self.target = "127.0.0.1:%d" % self.proxy.port
        self.rng = np.random.default_rng(7)

    def tearDown(self):
        self.proxy.close()

    def test_striped_jobs_match_the_reference_for_both_sides_layouts_and_dtypes(self):
        # Fresh clients per job: the proxy counts each job's connections.
        for dtype in (np.float32, np.float64):
            for order in "CF":
                for side in ("right", "left"):
                    with self.subTest(dtype=dtype.__name__, order=order, side=side):
                        a = np.asarray(self.rng.uniform(-4, 4, (301, 203)), dtype=dtype,
                                       order=order)
                        d = self.rng.uniform(-4, 4, 203 if side == "right" else 301)
                        d = d.astype(dtype)
                        out = poisoned(a.shape, dtype, order)
                        before = self.proxy.connections
                        progress = []
                        with dgmm.Client(self.target, **SMALL) as client:
                            c, stats, info = client.multiply(
                                a, d, side=side, stripes=3, out=out, return_stats=True,
                                return_info=True, progress=lambda done, total:
                                progress.append((done, total)))
                        self.assertIs(c, out)
                        assert_exact(self, c, a, d, side)
                        self.assertEqual(info.stripes, 3)
                        self.assertEqual(info.attempts, 3)
                        self.assertRegex(info.group_id, r"^[0-9a-f]{16}$")
                        self.assertGreaterEqual(self.proxy.connections - before, 3)
                        self.assertEqual(sum(s.bytes_in for s in info.stats), a.nbytes)
                        self.assertEqual(stats.bytes_out, a.nbytes)
                        lines = a.shape[1] if order == "F" else a.shape[0]
                        self.assertEqual(progress[-1], (lines, lines))
                        self.assertEqual([p[0] for p in progress],
                                         sorted(p[0] for p in progress))

    def test_k_is_capped_at_the_number_of_lines(self):
        with dgmm.Client(self.target, **SMALL) as client:
            a = self.rng.uniform(-4, 4, (5, 300))
            d = self.rng.uniform(-4, 4, 300)
            c, info = client.multiply(a, d, stripes=50, return_info=True)
            self.assertEqual(info.stripes, 5)
            assert_exact(self, c, a, d, "right")
            a = np.asfortranarray(a)
            c, info = client.multiply(a, d, stripes=50, return_info=True)
            self.assertEqual(info.stripes, 50)  # 300 columns: 50 parts of 6.
            assert_exact(self, c, a, d, "right")

    def test_parts_carry_ranges_group_and_diagonal_slices(self):
        # The server echoes each part's JobHeader.group in its stats; a part
        # given the wrong slice of the diagonal (or the whole of it where a
        # slice belongs) would be refused or give a wrong result.
        cases = [("C", "left"), ("C", "right"), ("F", "right"), ("F", "left")]
        for order, side in cases:
            with self.subTest(order=order, side=side):
                with dgmm.Client(self.target, **SMALL) as client:
                    a = np.asarray(self.rng.uniform(-4, 4, (10, 10)), order=order)
                    d = self.rng.uniform(-4, 4, 10)
                    out = poisoned(a.shape, a.dtype, order)
                    c, info = client.multiply(a, d, side=side, stripes=4, out=out,
                                              return_info=True)
                assert_exact(self, c, a, d, side)
                groups = sorted((s.group for s in info.stats), key=lambda g: g.first_line)
                self.assertEqual([g.first_line for g in groups], [0, 3, 6, 8])
                self.assertEqual({g.id for g in groups}, {info.group_id})
                self.assertTrue(re.fullmatch("[0-9a-f]{16}", info.group_id))
                for g in groups:
                    self.assertEqual((g.total_lines, g.parts), (10, 4))
                self.assertEqual([s.bytes_in for s in info.stats],
                                 [n * 10 * 8 for n in (3, 3, 2, 2)])

    def test_one_part_is_not_a_group(self):
        with dgmm.Client(self.target, **SMALL) as client:
            a = self.rng.uniform(-4, 4, (300, 300))
            c, info = client.multiply(a, np.ones(300), return_info=True)
            self.assertEqual((info.stripes, info.group_id), (1, ""))
            self.assertFalse(info.stats[0].HasField("group"))

    def test_wrong_output_array_is_refused(self):
        with dgmm.Client(self.target) as client:
            a = np.ones((4, 3))
            for out in (np.empty((3, 4)), np.empty((4, 3), np.float32),
                        np.empty((4, 3), order="F")):
                with self.assertRaisesRegex(ValueError, "out must be"):
                    client.multiply(a, np.ones(3), out=out)


class ResumeTest(unittest.TestCase):
    """Rule 3: a stream reset mid-way resumes with the lines not yet received."""

    def run_with_resets(self, resets, stripes, max_attempts=4, shape=(2000, 500)):
        proxy = ResetProxy(("127.0.0.1", port_of(SERVER.address)), 1 * MIB, resets,
                           reset_after_result_bytes=128 * KIB)
        try:
            rng = np.random.default_rng(11)
            a = rng.uniform(-4, 4, shape).astype(np.float32)
            d = rng.uniform(-4, 4, shape[0]).astype(np.float32)
            out = poisoned(shape, np.float32, "C")
            # same_host=False: these cases are about the socket; the
            # same-host probe (GetServerInfo on the main channel, which striped
            # parts do not use) would take one of the connections the proxy cuts.
            with dgmm.Client("127.0.0.1:%d" % proxy.port,
                             retry=dgmm.RetryPolicy(max_attempts=max_attempts), same_host=False,
                             **SMALL) as client:
                start = time.monotonic()
                try:
                    _, info = client.multiply(a, d, side="left", stripes=stripes, out=out,
                                              return_info=True, timeout=30)
                    return a, d, out, info, None, proxy.resets_done, time.monotonic() - start
                except dgmm.DgmmError as e:
                    return a, d, out, e.info, e, proxy.resets_done, time.monotonic() - start
        finally:
            proxy.close()

    def test_reset_stream_resumes_and_every_line_arrives_once(self):
        a, d, out, info, error, resets, _ = self.run_with_resets(resets=1, stripes=1)
        self.assertIsNone(error)
        self.assertEqual(resets, 1)
        self.assertEqual((info.mode, info.attempts, info.resumed), ("stream", 2, 1))
        assert_exact(self, out, a, d, "left")
        # The resumed attempt carried only the missing lines.
        self.assertLess(info.stats[0].bytes_in, a.nbytes)

    def test_striped_parts_resume_independently(self):
        a, d, out, info, error, resets, _ = self.run_with_resets(resets=2, stripes=2)
        self.assertIsNone(error)
        self.assertEqual(resets, 2)
        self.assertEqual(info.attempts, 4)
        self.assertGreaterEqual(info.resumed, 1)
        assert_exact(self, out, a, d, "left")

    def test_without_retries_the_first_failure_is_the_jobs_one_status(self):
        a, d, out, info, error, resets, elapsed = self.run_with_resets(
            resets=1, stripes=2, max_attempts=1, shape=(4000, 500))
        self.assertIsNotNone(error)
        self.assertEqual(error.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(info.attempts, 2)  # One per part, none retried.
        self.assertLess(elapsed, 20)

    def test_deadline_covers_every_part(self):
        with dgmm.Client(SERVER.address) as client:
            a = np.random.default_rng(12).uniform(-4, 4, (3000, 3000))
            start = time.monotonic()
            with self.assertRaises(dgmm.DgmmError) as raised:
                client.multiply(a, np.ones(3000), stripes=4, timeout=0.05)
            self.assertEqual(raised.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
            self.assertLess(time.monotonic() - start, 5)


if __name__ == "__main__":
    unittest.main()
