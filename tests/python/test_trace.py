"""W3C trace context through the Python client (package `dgmm`) and the real
server, and the server's JSON log (docs/protocol.md "Trace context",
docs/operations.md "Logs"):

- multiply(..., traceparent=, tracestate=) reaches each part's stats (every
  part of a striped job: the same trace id) and the server's job lines;
- without one the client makes a new valid traceparent per job
  (info.traceparent), which the stats name;
- multiply_batch(..., traceparent=) reaches every job's stats;
- an invalid traceparent is refused before any call;
- with --log_format=json every line of the server's log is one JSON object
  (json.loads), and each job line has its id, RPC, client, trace ids,
  status, device, bytes and stage times: "-"-free nulls for a job without
  trace context, and the error message escaped.

Run by ctest (python_trace) with the build's venv, or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server build/python-venv/bin/python \
    tests/python/test_trace.py -v
"""

import json
import os
import re
import sys
import time
import unittest

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

if __name__ == "__main__":
    try:
        import grpc  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as missing:
        print("SKIP: %s lacks a client dependency (%s)" % (sys.executable, missing))
        sys.exit(77)

import grpc  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess  # noqa: E402
import dgmm  # noqa: E402

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = "00-%s-%s-01" % (TRACE, PARENT)
TRACEPARENT_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")

SERVER = None


def setUpModule():
    global SERVER
    SERVER = ServerProcess(flags=["--log_format=json", "--threads=2"], prefix="dgmm-py-trace-")


def tearDownModule():
    if SERVER:
        SERVER.stop()


def operands(rows, cols, seed):
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.5, 2, (rows, cols)).astype(np.float32),
            rng.uniform(0.5, 2, cols).astype(np.float32))


def job_lines():
    """The job lines of the server's log so far, each parsed as JSON; every
    other line of the log must be JSON too."""
    jobs = []
    for line in SERVER.log().splitlines():
        record = json.loads(line)  # raises on a line that is not JSON
        for key in ("time", "level", "msg"):
            assert key in record, line
        if record["msg"] == "job":
            jobs.append(record)
    return jobs


def wait_for_job(predicate, timeout=5.0):
    """The first job line for which predicate(record) holds (polled)."""
    until = time.monotonic() + timeout
    while True:
        for record in job_lines():
            if predicate(record):
                return record
        if time.monotonic() > until:
            raise AssertionError("no such job line in:\n%s" % SERVER.log())
        time.sleep(0.05)


class TraceTest(unittest.TestCase):
    def setUp(self):
        self.client = dgmm.Client(SERVER.address)

    def tearDown(self):
        self.client.close()

    def test_a_given_traceparent_reaches_every_part(self):
        a, d = operands(64, 16, 1)
        c, info = self.client.multiply(a, d, stripes=4, return_info=True,
                                       traceparent=TRACEPARENT, tracestate="congo=t61rcWkgMzE")
        np.testing.assert_allclose(c, a * d, rtol=1e-6)
        self.assertEqual(info.traceparent, TRACEPARENT)
        self.assertEqual(len(info.stats), 4)
        spans = set()
        for part in info.stats:
            self.assertEqual(part.trace_id, TRACE)
            self.assertEqual(part.parent_span_id, PARENT)
            self.assertRegex(part.span_id, HEX16)
            spans.add(part.span_id)
            record = wait_for_job(lambda r, p=part: r["job_id"] == p.job_id)
            self.assertEqual(record["trace_id"], TRACE)
            self.assertEqual(record["parent_span_id"], PARENT)
            self.assertEqual(record["span_id"], part.span_id)
            self.assertEqual(record["trace_flags"], "01")
            self.assertEqual(record["method"], "MultiplySmall")
            self.assertEqual(record["client"], "127.0.0.1")
            self.assertEqual(record["status"], "OK")
            self.assertEqual(record["level"], "info")
            self.assertEqual(record["group"]["parts"], 4)
            self.assertEqual(record["group"]["id"], part.group.id)
            self.assertEqual(record["bytes_in"], part.bytes_in)
            for key in ("device", "queue_wait_ns", "h2d_ns", "compute_ns", "d2h_ns",
                        "total_ns", "bytes_out"):
                self.assertIn(key, record)
        self.assertEqual(len(spans), 4)

    def test_the_client_makes_one_per_job(self):
        a, d = operands(4, 4, 2)
        seen = set()
        for stream in (None, True):
            _c, stats, info = self.client.multiply(a, d, stream=stream, return_stats=True,
                                                   return_info=True)
            m = TRACEPARENT_RE.match(info.traceparent)
            self.assertIsNotNone(m, info.traceparent)
            self.assertNotEqual(m.group(1), "0" * 32)
            self.assertEqual(m.group(3), "00")
            self.assertEqual(stats.trace_id, m.group(1))
            self.assertEqual(stats.parent_span_id, m.group(2))
            seen.add(m.group(1))
        self.assertEqual(len(seen), 2)

    def test_a_batch_carries_it(self):
        jobs = [operands(2, 3, 10 + i) for i in range(3)]
        results = self.client.multiply_batch(jobs, return_stats=True, traceparent=TRACEPARENT)
        for (a, d), (c, stats) in zip(jobs, results):
            np.testing.assert_allclose(c, a * d, rtol=1e-6)
            self.assertEqual(stats.trace_id, TRACE)
            self.assertEqual(stats.parent_span_id, PARENT)
        made = self.client.multiply_batch(jobs, return_stats=True)
        self.assertRegex(made[0][1].trace_id, r"^[0-9a-f]{32}$")
        self.assertNotEqual(made[0][1].trace_id, TRACE)

    def test_an_invalid_traceparent_is_refused_before_any_call(self):
        a, d = operands(2, 2, 3)
        for bad in ("00-" + TRACE.upper() + "-" + PARENT + "-01", "ff-%s-%s-01" % (TRACE, PARENT),
                    "00-%s-0000000000000000-01" % TRACE, "nonsense"):
            with self.assertRaises(dgmm.DgmmError) as raised:
                self.client.multiply(a, d, traceparent=bad)
            self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("traceparent", raised.exception.details)
        with self.assertRaises(dgmm.DgmmError) as raised:
            self.client.multiply(a, d, tracestate="a=1")
        self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_json_lines_of_failed_and_untraced_jobs(self):
        # Untraced: a plain grpcio call, with no traceparent at all.
        from dgmm import pb
        header = pb.JobHeader(rows=1, cols=2, dtype=pb.DTYPE_FLOAT32, side=pb.SIDE_RIGHT,
                              diagonal=np.ones(2, np.float32).tobytes())
        request = pb.MultiplyRequest(header=header, matrix=np.ones(2, np.float32).tobytes())
        with grpc.insecure_channel(SERVER.address) as channel:
            response = channel.unary_unary(
                "/dgmm.v1.Dgmm/MultiplySmall", request_serializer=pb.MultiplyRequest.SerializeToString,
                response_deserializer=pb.MultiplyResponse.FromString)(request, timeout=10)
            self.assertEqual(response.stats.trace_id, "")
            record = wait_for_job(lambda r: r["job_id"] == response.stats.job_id)
            for key in ("trace_id", "parent_span_id", "span_id", "trace_flags"):
                self.assertIsNone(record[key])
            # Failed once its header was valid: job 0, its message escaped in
            # the line, the caller's trace named.
            huge = pb.JobHeader(rows=1 << 20, cols=1 << 20, dtype=pb.DTYPE_FLOAT64,
                                side=pb.SIDE_LEFT, diagonal=bytes(8 << 20))
            call = channel.unary_unary(
                "/dgmm.v1.Dgmm/Multiply", request_serializer=pb.MultiplyRequest.SerializeToString,
                response_deserializer=pb.MultiplyResponse.FromString)
            traceparent = "00-%s-1234567890abcdef-00" % TRACE
            with self.assertRaises(grpc.RpcError) as raised:
                call(pb.MultiplyRequest(header=huge), timeout=10,
                     metadata=[("traceparent", traceparent)])
            self.assertEqual(raised.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            trailers = dict(raised.exception.trailing_metadata())
            self.assertTrue(trailers["traceparent"].startswith("00-%s-" % TRACE))
            record = wait_for_job(lambda r: r["parent_span_id"] == "1234567890abcdef")
            self.assertEqual(record["job_id"], 0)
            self.assertEqual(record["status"], "RESOURCE_EXHAUSTED")
            self.assertEqual(record["outcome"], "too_large")
            self.assertEqual(record["level"], "warning")
            self.assertEqual(record["span_id"], trailers["traceparent"][36:52])
            self.assertIn("needs", record["error"])


if __name__ == "__main__":
    unittest.main()
