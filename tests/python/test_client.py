"""The Python client (client/python, package `dgmm`) against the real server.

Run by ctest (test `python_client`) with the build's venv, where the package
is installed (tests/python/CMakeLists.txt), or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server build/python-venv/bin/python \
    tests/python/test_client.py -v
Exits 77 (ctest's skip code here) when this interpreter lacks grpcio/numpy.
"""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
EXAMPLE = os.path.join(REPO, "client", "python", "examples", "quickstart.py")
PROTOCOL_DOC = os.path.join(REPO, "docs", "protocol.md")

if __name__ == "__main__":
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as missing:
        print("SKIP: %s lacks a client dependency (%s); on Debian: apt-get install "
              "python3-grpcio python3-protobuf python3-numpy" % (sys.executable, missing))
        sys.exit(77)

import grpc  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess, reference, tolerance  # noqa: E402,F401
import dgmm  # noqa: E402


class Server(ServerProcess):
    """A dgmm-server process (CPU backend) on an ephemeral loopback port."""

    def __init__(self, *flags):
        super().__init__(flags=flags, prefix="dgmm-py-test-")


SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server()


def tearDownModule():
    if SERVER:
        SERVER.stop()


def mode_of(client, a, d, **kw):
    """The RPC that carried a checked job: "unary" or "stream"."""
    c, info = client.multiply(a, d, return_info=True, **kw)
    np.testing.assert_allclose(c, reference(a, d, kw.get("side", "right")),
                               rtol=tolerance(a.dtype), atol=0)
    return info.mode


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.client = dgmm.Client(SERVER.address)
        self.rng = np.random.default_rng(1234)

    def tearDown(self):
        self.client.close()

    def random(self, shape, dtype, order="C"):
        return np.asarray(self.rng.uniform(-4, 4, shape), dtype=dtype, order=order)

    def check(self, a, side, **kwargs):
        d = self.random(a.shape[1] if side == "right" else a.shape[0], a.dtype)
        c = self.client.multiply(a, d, side=side, **kwargs)
        self.assertEqual(c.dtype, a.dtype)
        self.assertEqual(c.shape, a.shape)
        np.testing.assert_allclose(c, reference(a, d, side), rtol=tolerance(a.dtype), atol=0)
        return c

    def test_matches_numpy_for_both_sides_dtypes_and_layouts(self):
        for dtype in (np.float32, np.float64):
            for order in "CF":
                for side in ("right", "left"):
                    for stream in (False, True):
                        with self.subTest(dtype=dtype.__name__, order=order, side=side,
                                          stream=stream):
                            c = self.check(self.random((67, 41), dtype, order), side,
                                           stream=stream)
                            self.assertTrue(c.flags[order + "_CONTIGUOUS"])

    def test_fortran_result_keeps_fortran_layout(self):
        c = self.check(self.random((50, 30), np.float64, "F"), "right")
        self.assertTrue(c.flags.f_contiguous)
        self.assertFalse(c.flags.c_contiguous)

    def test_non_contiguous_input_is_sent_as_a_c_order_copy(self):
        a = self.random((80, 60), np.float32)[::2, 1::3]
        c = self.check(a, "left")
        self.assertTrue(c.flags.c_contiguous)

    def test_big_endian_input_gives_a_native_result(self):
        a = self.random((20, 10), np.dtype(">f8"))
        d = self.random(10, np.dtype(">f8"))
        c = self.client.multiply(a, d)
        np.testing.assert_array_equal(c, reference(a, d, "right"))

    def test_result_is_writable(self):
        c = self.check(self.random((4, 5), np.float64), "right")
        c[0, 0] = 1.0

    def test_stats_describe_the_job(self):
        a = self.random((100, 70), np.float64)
        _, stats = self.client.multiply(a, np.ones(70), return_stats=True)
        self.assertEqual(stats.bytes_in, a.nbytes)
        self.assertEqual(stats.bytes_out, a.nbytes)
        self.assertEqual(stats.backend, dgmm.pb.BACKEND_CPU)
        self.assertEqual(stats.device_index, -1)
        self.assertGreater(stats.total_ns, 0)

    def test_large_job_is_streamed_and_correct(self):
        a = self.random((3000, 3000), np.float64)  # 72 MB
        d = self.random(3000, np.float64)
        c, stats = self.client.multiply(a, d, side="left", stream=True, return_stats=True)
        np.testing.assert_array_equal(c, reference(a, d, "left"))
        self.assertEqual(stats.bytes_in, a.nbytes)

    def test_matrix_over_the_unary_limit_goes_through_multiply_stream(self):
        # Policy rule 1: unary up to min(block, 7/8 of the unary limit) = 256 KiB.
        client = dgmm.Client(SERVER.address, unary_limit_bytes=1 << 20, block_bytes=1 << 18)
        try:
            a = self.random((700, 500), np.float32, "F")  # 1.4 MB in blocks of 93 columns
            d = self.random(500, np.float32)
            c = client.multiply(a, d)
            np.testing.assert_allclose(c, reference(a, d, "right"), rtol=tolerance(a.dtype),
                                       atol=0)
            self.assertTrue(c.flags.f_contiguous)
            self.assertEqual(mode_of(client, a, d), "stream")
            self.assertEqual(mode_of(client, a[:10, :10], d[:10]), "unary")
        finally:
            client.close()

    def test_wrong_diagonal_length_is_invalid_argument_with_the_servers_message(self):
        a = self.random((30, 20), np.float64)
        for stream in (False, True):
            with self.subTest(stream=stream):
                with self.assertRaises(dgmm.DgmmError) as raised:
                    self.client.multiply(a, np.ones(19), stream=stream)
                error = raised.exception
                self.assertEqual(error.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("diagonal", error.details.lower())
                self.assertIn(error.details, str(error))

    def test_multiply_batch_each_job_its_own_result_or_error(self):
        jobs, expected = [], []
        for dtype in (np.float32, np.float64):
            for order in "CF":
                for side in ("right", "left"):
                    for shape in ((1, 1), (7, 3), (100, 100)):
                        a = self.random(shape, dtype, order)
                        d = self.random(shape[1] if side == "right" else shape[0], dtype)
                        jobs.append((a, d, side))
                        expected.append(reference(a, d, side))
        bad = (self.random((30, 20), np.float64), np.ones(19))  # a diagonal one short
        jobs.insert(3, bad)
        expected.insert(3, None)
        results = self.client.multiply_batch(jobs, return_stats=True)
        self.assertEqual(len(results), len(jobs))
        for i, (job, result, ref) in enumerate(zip(jobs, results, expected)):
            with self.subTest(i=i):
                if ref is None:
                    self.assertIsInstance(result, dgmm.DgmmError)
                    self.assertEqual(result.code, grpc.StatusCode.INVALID_ARGUMENT)
                    # The words a Multiply call of it gets.
                    with self.assertRaises(dgmm.DgmmError) as raised:
                        self.client.multiply(*job)
                    self.assertEqual(result.details, raised.exception.details)
                    continue
                c, stats = result
                self.assertEqual(c.dtype, job[0].dtype)
                self.assertEqual(c.flags.f_contiguous and not c.flags.c_contiguous,
                                 job[0].flags.f_contiguous and not job[0].flags.c_contiguous)
                np.testing.assert_allclose(c, ref, rtol=tolerance(job[0].dtype), atol=0)
                self.assertEqual(stats.bytes_out, job[0].nbytes)
        self.assertEqual(self.client.multiply_batch([]), [])

    def test_multiply_batch_over_the_job_limit_raises_resource_exhausted(self):
        server = Server("--max_batch_jobs=4")
        try:
            with dgmm.Client(server.address) as client:
                jobs = [(np.ones((2, 2)), np.ones(2))] * 5
                with self.assertRaises(dgmm.DgmmError) as raised:
                    client.multiply_batch(jobs)
                self.assertEqual(raised.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertIn("--max_batch_jobs", raised.exception.details)
                self.assertEqual(len(client.multiply_batch(jobs[:4])), 4)
        finally:
            server.stop()

    def test_unsupported_arrays_are_rejected_before_sending(self):
        # float16 and complex matrices are jobs of their own (test_dtypes.py),
        # and so is a complex64 or complex128 diagonal with a real matrix (C
        # complex, as NumPy gives it); a wider complex type is not.
        bad = [(np.ones((3, 3), dtype=np.int64), np.ones(3), "float32, float64"),
               (np.ones((3, 3), dtype=np.uint16), np.ones(3), "float32, float64"),
               (np.ones((3, 3), dtype=np.float32), np.ones(3, np.clongdouble),
                "complex64 and complex128"),
               (np.ones((3, 3), dtype=np.float32), np.array(["1", "2", "3"]), "numbers"),
               (np.ones(3), np.ones(3), "2-D"),
               (np.ones((3, 3)), np.ones((3, 1)), "1-D")]
        for a, d, words in bad:
            with self.subTest(a=a.dtype, shape=a.shape):
                with self.assertRaisesRegex(ValueError, words):
                    self.client.multiply(a, d)
        with self.assertRaisesRegex(ValueError, "side"):
            self.client.multiply(np.ones((2, 2)), np.ones(2), side="top")

    def test_expired_deadline_is_deadline_exceeded(self):
        a = self.random((2000, 2000), np.float64)
        with self.assertRaises(dgmm.DgmmError) as raised:
            self.client.multiply(a, np.ones(2000), stream=True, timeout=0.001)
        self.assertEqual(raised.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)

    def test_server_info_lists_the_cpu_and_limits(self):
        info = self.client.server_info()
        self.assertTrue(info.version)
        self.assertIn(-1, [device.index for device in info.devices])
        self.assertGreater(info.limits.max_unary_message_bytes, 0)
        self.assertGreater(info.limits.max_block_bytes, 0)
        self.assertIn(dgmm.pb.DTYPE_FLOAT32, info.dtypes)
        self.assertIn(dgmm.pb.DTYPE_FLOAT64, info.dtypes)

    def test_health_is_serving(self):
        self.assertEqual(self.client.health(), "SERVING")

    def test_unreachable_server_is_unavailable(self):
        with socket_free_port() as port:
            client = dgmm.Client("127.0.0.1:%d" % port)
            with self.assertRaises(dgmm.DgmmError) as raised:
                client.health(timeout=5)
            client.close()
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)


def wait_stopped(pid, seconds=10):
    """Waits until every thread of `pid` is stopped (SIGSTOP takes effect
    asynchronously: a thread running on another CPU stops a moment later)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(state == "T" for state in states):
            return
        time.sleep(0.01)
    raise AssertionError("process %d did not stop" % pid)


class CallTimeoutTest(unittest.TestCase):
    def test_server_info_and_health_end_at_their_timeout_on_a_stopped_server(self):
        server = Server()
        client = dgmm.Client(server.address)
        try:
            self.assertEqual(client.health(timeout=5), "SERVING")  # connected
            server.process.send_signal(signal.SIGSTOP)
            wait_stopped(server.process.pid)
            for call in (lambda: client.server_info(timeout=0.2),
                         lambda: client.health(timeout=0.2)):
                start = time.monotonic()
                with self.assertRaises(dgmm.DgmmError) as raised:
                    call()
                self.assertEqual(raised.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
                self.assertGreaterEqual(time.monotonic() - start, 0.15)  # not before it
            with self.assertRaises(ValueError):
                client.health(timeout=0)
        finally:
            server.process.send_signal(signal.SIGCONT)
            client.close()
            server.stop()


class ConstrainedServerTest(unittest.TestCase):
    """A server with a small budget, unary limit and max_dim."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--host_memory_budget=40MiB", "--max_unary_message_bytes=1MiB",
                            "--max_dim=4096")
        # Policy rule 1: U is the client's option (default 16 MiB); a client
        # of this server sets it to the server's 1 MiB.
        cls.client = dgmm.Client(cls.server.address, max_unary_message_bytes=1 << 20)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def test_client_streams_jobs_over_the_servers_unary_limit(self):
        a = np.random.default_rng(5).standard_normal((600, 500))  # 2.4 MB > 1 MiB
        d = np.linspace(-1, 1, 500)
        self.assertEqual(mode_of(self.client, a, d), "stream")

    def test_default_client_sends_a_job_over_a_lower_server_limit_unary_and_is_refused(self):
        # 2.4 MB is under the default threshold (4 MiB) but over this
        # server's 1 MiB: the server's RESOURCE_EXHAUSTED, not retried.
        with dgmm.Client(self.server.address) as client:
            a = np.random.default_rng(5).standard_normal((600, 500))
            with self.assertRaises(dgmm.DgmmError) as raised:
                client.multiply(a, np.ones(500), return_info=True)
            self.assertEqual(raised.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertEqual(raised.exception.info.attempts, 1)
            self.assertEqual(raised.exception.info.mode, "unary")

    def test_streamed_job_larger_than_the_budget_runs(self):
        a = np.random.default_rng(6).standard_normal((3000, 3000))  # 72 MB > 40 MiB budget
        d = np.linspace(-1, 1, 3000)
        c = self.client.multiply(a, d, side="left")
        np.testing.assert_array_equal(c, reference(a, d, "left"))

    def test_shape_over_max_dim_is_resource_exhausted_naming_the_limit(self):
        with self.assertRaises(dgmm.DgmmError) as raised:
            self.client.multiply(np.ones((1, 5000)), np.ones(5000))
        self.assertEqual(raised.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("4096", raised.exception.details)


class OlderServerTest(unittest.TestCase):
    """A server without MultiplySmall (--multiply_small=false answers it as a
    server older than the method): small jobs go with Multiply instead, one
    attempt each."""

    def test_small_jobs_fall_back_to_multiply(self):
        server = Server("--multiply_small=false")
        try:
            with dgmm.Client(server.address) as client:
                rng = np.random.default_rng(21)
                for dtype in (np.float32, np.float64):
                    for side in ("right", "left"):
                        a = np.asarray(rng.uniform(-4, 4, (30, 20)), dtype=dtype)
                        d = np.asarray(rng.uniform(-4, 4, 20 if side == "right" else 30), dtype=dtype)
                        c, info = client.multiply(a, d, side=side, return_info=True)
                        np.testing.assert_allclose(c, reference(a, d, side),
                                                   rtol=tolerance(a.dtype), atol=0)
                        self.assertEqual(info.mode, "unary")
                        self.assertEqual(info.attempts, 1)
        finally:
            server.stop()


class SecureServerTest(unittest.TestCase):
    """Mutual TLS and a bearer token, with certificates made by openssl here."""

    @classmethod
    def setUpClass(cls):
        cls.pki = tempfile.TemporaryDirectory(prefix="dgmm-py-pki-")
        d = cls.pki.name
        script = """set -e
cd "%s"
o() { openssl "$@" >/dev/null 2>&1; }
o req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=py test ca"
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > ext
o req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost"
o x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile ext
o req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=py client"
o x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2
printf 'py-token-%%s' "$RANDOM$RANDOM" > token
""" % d
        subprocess.run(["bash", "-c", script], check=True)
        cls.read = staticmethod(lambda name: pathlib.Path(d, name).read_bytes())
        cls.server = Server("--tls_cert=" + os.path.join(d, "server.pem"),
                            "--tls_key=" + os.path.join(d, "server.key"),
                            "--tls_client_ca=" + os.path.join(d, "ca.pem"),
                            "--auth_token_file=" + os.path.join(d, "token"))
        cls.address = "localhost:" + cls.server.address.split(":")[1]

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.pki.cleanup()

    def credentials(self, with_client_cert=True):
        if not with_client_cert:
            return grpc.ssl_channel_credentials(self.read("ca.pem"))
        return grpc.ssl_channel_credentials(self.read("ca.pem"), self.read("client.key"),
                                            self.read("client.pem"))

    def test_mutual_tls_with_token_computes(self):
        token = self.read("token").decode()
        with dgmm.Client(self.address, credentials=self.credentials(), token=token) as client:
            a = np.random.default_rng(8).random((40, 30)).astype(np.float32)
            d = np.random.default_rng(9).random(30).astype(np.float32)
            np.testing.assert_allclose(client.multiply(a, d), reference(a, d, "right"),
                                       rtol=tolerance(np.float32))

    def test_missing_or_wrong_token_is_unauthenticated(self):
        for token in (None, "wrong"):
            with dgmm.Client(self.address, credentials=self.credentials(),
                             token=token, unary_limit_bytes=1 << 20) as client:
                with self.assertRaises(dgmm.DgmmError) as raised:
                    client.multiply(np.ones((2, 2)), np.ones(2))
                self.assertEqual(raised.exception.code, grpc.StatusCode.UNAUTHENTICATED)

    def test_client_without_certificate_is_refused(self):
        with dgmm.Client(self.address, credentials=self.credentials(with_client_cert=False),
                         token=self.read("token").decode(),
                         unary_limit_bytes=1 << 20) as client:
            with self.assertRaises(dgmm.DgmmError) as raised:
                client.multiply(np.ones((2, 2)), np.ones(2), timeout=10)
            self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)


class socket_free_port:
    """A loopback port that nothing listens on, while the context is open."""

    def __enter__(self):
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # Bound, not listening: connections are refused.
        return self.sock.getsockname()[1]

    def __exit__(self, *exc):
        self.sock.close()


class RetryPolicyTest(unittest.TestCase):
    """dgmm.RetryPolicy.delay: the same rules as the C++ client's RetryDelay."""

    def test_backoff_grows_by_the_multiplier_up_to_the_cap_with_bounded_jitter(self):
        policy = dgmm.RetryPolicy(max_attempts=10, initial_backoff=0.1, max_backoff=0.35,
                                  backoff_multiplier=2)
        unavailable = grpc.StatusCode.UNAVAILABLE

        def delay(made, jitter):
            return policy.delay(made, unavailable, None, 0.0, None, jitter)
        self.assertAlmostEqual(delay(1, 0), 0.1)
        self.assertAlmostEqual(delay(2, 0), 0.2)
        self.assertAlmostEqual(delay(3, 0), 0.35)
        self.assertAlmostEqual(delay(1, 1), 0.12)
        self.assertAlmostEqual(delay(1, -1), 0.08)
        self.assertIsNone(delay(10, 0))  # no attempts left

    def test_only_unavailable_and_hinted_resource_exhausted_are_retried(self):
        policy = dgmm.RetryPolicy()
        code = grpc.StatusCode
        self.assertAlmostEqual(policy.delay(1, code.RESOURCE_EXHAUSTED, 42, 0.0, None, 0), 0.042)
        self.assertIsNone(policy.delay(1, code.RESOURCE_EXHAUSTED, None, 0.0, None, 0))
        self.assertIsNone(policy.delay(1, code.DEADLINE_EXCEEDED, None, 0.0, None, 0))
        self.assertIsNone(policy.delay(1, code.INVALID_ARGUMENT, None, 0.0, None, 0))
        self.assertIsNone(policy.delay(1, code.UNAVAILABLE, None, 0.0, 0.05, 0))  # past deadline

    def test_rule_three_by_code_and_origin(self):
        """INTERNAL, UNKNOWN and RESOURCE_EXHAUSTED without
        `dgmm-origin: server` are the transport's and get the UNAVAILABLE
        backoff; with it they are final; CANCELLED and DEADLINE_EXCEEDED
        never retry."""
        policy = dgmm.RetryPolicy(max_attempts=10)
        code = grpc.StatusCode
        for c in (code.INTERNAL, code.UNKNOWN, code.RESOURCE_EXHAUSTED):
            self.assertAlmostEqual(policy.delay(1, c, None, 0.0, None, 0, from_server=False), 0.1)
            self.assertAlmostEqual(policy.delay(3, c, None, 0.0, None, 0, from_server=False), 0.4)
            self.assertIsNone(policy.delay(1, c, None, 0.0, None, 0, from_server=True))
            self.assertIsNone(policy.delay(10, c, None, 0.0, None, 0, from_server=False))
            self.assertIsNone(policy.delay(1, c, None, 0.0, 0.05, 0, from_server=False))
        for origin in (True, False):
            self.assertAlmostEqual(policy.delay(1, code.UNAVAILABLE, None, 0.0, None, 0,
                                                from_server=origin), 0.1)
            self.assertAlmostEqual(policy.delay(1, code.RESOURCE_EXHAUSTED, 42, 0.0, None, 0,
                                                from_server=origin), 0.042)
            for c in (code.CANCELLED, code.DEADLINE_EXCEEDED, code.INVALID_ARGUMENT,
                      code.UNAUTHENTICATED, code.NOT_FOUND, code.UNIMPLEMENTED):
                self.assertIsNone(policy.delay(1, c, None, 0.0, None, 0, from_server=origin))
                self.assertIsNone(policy.delay(1, c, 5, 0.0, None, 0, from_server=origin))

    def test_unusable_policy_is_refused(self):
        with self.assertRaisesRegex(ValueError, "max_attempts"):
            dgmm.RetryPolicy(max_attempts=0)

    def test_dead_server_fails_fast_without_retries_and_after_the_reconnect_wait_with(self):
        a, d = np.ones((4, 4), np.float32), np.ones(4, np.float32)
        with socket_free_port() as port:
            target = "127.0.0.1:%d" % port
            with dgmm.Client(target, unary_limit_bytes=1 << 20, block_bytes=1 << 20,
                             retry=dgmm.RetryPolicy(max_attempts=1)) as client:
                start = time.monotonic()
                with self.assertRaises(dgmm.DgmmError) as raised:
                    client.multiply(a, d)
                self.assertLess(time.monotonic() - start, 1.0)
                self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
                self.assertNotIn("attempts", raised.exception.details)
            with dgmm.Client(target, unary_limit_bytes=1 << 20, block_bytes=1 << 20,
                             retry=dgmm.RetryPolicy(max_reconnect_wait=0.5)) as client:
                start = time.monotonic()
                with self.assertRaises(dgmm.DgmmError) as raised:
                    client.multiply(a, d)
                elapsed = time.monotonic() - start
                self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
                self.assertIn("no connection to the server within", raised.exception.details)
                self.assertIn("(after 2 attempts)", raised.exception.details)
                self.assertGreaterEqual(elapsed, 0.5)
                self.assertLess(elapsed, 3.0)


class ReconnectTest(unittest.TestCase):
    """Busy clients resume within 2 s of a restart on the same port."""

    CLIENTS = 4
    DOWNTIME = 3.0
    ALLOWED = 2.0

    def test_busy_clients_resume_within_two_seconds_of_a_restart(self):
        with socket_free_port() as port:
            pass  # Free again now; the server takes it.
        address = "127.0.0.1:%d" % port
        flags = ("--listen=" + address, "--threads=2")
        server = Server(*flags)
        self.assertEqual(server.address, address)
        stop = threading.Event()
        successes = [[] for _ in range(self.CLIENTS)]
        errors = [[] for _ in range(self.CLIENTS)]
        started = [[] for _ in range(self.CLIENTS)]  # When each successful job began.

        def busy(i):
            rng = np.random.default_rng(i)
            a = rng.uniform(-2, 2, (16, 16)).astype(np.float32)
            d = rng.uniform(-2, 2, 16).astype(np.float32)
            with dgmm.Client(address) as client:
                while not stop.is_set():
                    try:
                        began = time.monotonic()
                        c = client.multiply(a, d)
                        if np.array_equal(c, a * d):
                            successes[i].append(time.monotonic())
                            started[i].append(began)
                        else:
                            errors[i].append("wrong result")
                    except dgmm.DgmmError as e:
                        errors[i].append(str(e))
                    time.sleep(0.002)

        threads = [threading.Thread(target=busy, args=(i,)) for i in range(self.CLIENTS)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 20
            while (min(len(s) for s in successes) < 3) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertGreaterEqual(min(len(s) for s in successes), 3,
                                    "not every client ran 3 jobs before the kill")

            server.process.kill()
            self.assertEqual(server.process.wait(), -signal.SIGKILL)
            killed = time.monotonic()
            server.dir.cleanup()
            time.sleep(0.3)
            self.assertFalse(answers_health(address), "something still answers on " + address)

            time.sleep(max(0.0, killed + self.DOWNTIME - time.monotonic()))
            restart = time.monotonic()
            server = Server(*flags)
            self.assertEqual(server.address, address)
            while not answers_health(address):
                self.assertLess(time.monotonic(), restart + 20, "the restarted server never answered")
                time.sleep(0.005)
            up = time.monotonic()
            for i in range(self.CLIENTS):
                # A job answered just before the kill may be seen a little
                # after it; one begun after the kill cannot succeed before
                # the restart.
                self.assertFalse([(b - killed, t - killed) for b, t in zip(started[i], successes[i])
                                  if killed <= b and t < restart],
                                 "client %d completed a job while the server was down" % i)

            give_up = up + 25
            while (not all(any(t >= restart for t in s) for s in successes)
                   and time.monotonic() < give_up):
                time.sleep(0.01)
        finally:
            stop.set()
            for t in threads:
                t.join()
            server.stop()

        print("\nserver down %.0f ms, up %.0f ms after the restart; first job after it answered "
              "health (ms):" % ((restart - killed) * 1000, (up - restart) * 1000))
        firsts = []
        for i in range(self.CLIENTS):
            first = next((t for t in successes[i] if t >= restart), None)
            firsts.append(first)
            print("  client %d: %s (%d failed jobs; last error: %s)"
                  % (i, "none" if first is None else "%.1f" % ((first - up) * 1000),
                     len(errors[i]), errors[i][-1] if errors[i] else "-"))
        for i, first in enumerate(firsts):
            self.assertIsNotNone(first, "client %d never completed a job after the restart" % i)
            self.assertLessEqual(first - up, self.ALLOWED, "client %d" % i)


def answers_health(address):
    """True when a fresh channel to `address` gets SERVING from health."""
    try:
        with dgmm.Client(address) as probe:
            return probe.health(timeout=0.5) == "SERVING"
    except dgmm.DgmmError:
        return False


class OneCoreTest(unittest.TestCase):
    """The package is a binding of the C++ client: every call goes through
    _core, so it opens no grpcio channel and speaks no socket protocol."""

    def test_the_package_opens_no_channel_or_socket_of_its_own(self):
        package = os.path.dirname(dgmm.__file__)
        for name in sorted(os.listdir(package)):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(package, name)) as f:
                text = f.read()
            for marker in ("insecure_channel(", "secure_channel(", "import socket",
                           "intercept_channel(", "add_metadata"):
                self.assertNotIn(marker, text, "%s uses %s" % (name, marker))

    def test_channel_options_the_core_does_not_take_are_refused(self):
        with self.assertRaises(ValueError):
            dgmm.Client(SERVER.address, options=[("grpc.max_receive_message_length", 1)])
        with dgmm.Client(SERVER.address,
                         options=[("grpc.lb_policy_name", "round_robin")]) as client:
            self.assertEqual(client.health(), "SERVING")


class ExampleAndDocTest(unittest.TestCase):
    def test_quickstart_example_runs(self):
        run = subprocess.run([sys.executable, EXAMPLE, SERVER.address],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("health: SERVING", run.stdout)
        self.assertIn("rejected: INVALID_ARGUMENT", run.stdout)

    def test_protocol_doc_quotes_the_example_verbatim(self):
        with open(EXAMPLE) as f:
            example = f.read().strip()
        with open(PROTOCOL_DOC) as f:
            self.assertIn(example, f.read(), "docs/protocol.md must quote " + EXAMPLE)


class InstalledPackageTest(unittest.TestCase):
    def test_the_package_is_the_installed_one_with_its_stubs_and_extension(self):
        # Run from an empty directory, with no protoc on PATH: nothing is generated at import.
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, PATH=tmp)
            env.pop("PYTHONPATH", None)
            code = ("import dgmm, dgmm._core, dgmm.v1.dgmm_pb2 as p; "
                    "print(dgmm.__file__); print(dgmm._core.__file__); print(p.__file__)")
            run = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp,
                                 capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        files = run.stdout.split()
        self.assertEqual(len(files), 3, run.stdout)
        for f in files:
            self.assertIn("site-packages", f)
            self.assertFalse(f.startswith(os.path.join(REPO, "client")), f)
        self.assertEqual(os.path.dirname(dgmm.__file__), os.path.dirname(files[0]))


if __name__ == "__main__":
    unittest.main()
