"""A server's drain never hangs a call of the Python client.

A real dgmm-server (CPU backend) is kept busy by CLIENTS dgmm.Clients, each
shared by THREADS threads running small jobs back to back with a 60 s
timeout; it is sent SIGTERM and not restarted. Every call, in particular
every call sent into the drain window (between the SIGTERM and the server's
exit), must end with OK or UNAVAILABLE within the reconnect limit (the
default RetryPolicy.max_reconnect_wait, 5 s) plus 2 s: none may wait out its
timeout. While the server drains it refuses jobs with UNAVAILABLE and the
clients retry them; a retried attempt that met the server's exit used to be
sent wait_for_ready and wait for a connection until its deadline. Half the
clients retry every 1-4 ms (default max_reconnect_wait) so that many retried
attempts meet the exit; ROUNDS rounds, each with a fresh server. A
MultiplyStream call that never sends its header keeps the drain going for the
server's whole shutdown grace (5 s). The one absolute time is the bound.

Run by ctest (python_drain) with the build's venv, or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server build/python-venv/bin/python \
    tests/python/test_drain.py -v
"""

import os
import sys
import threading
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

CLIENTS = 4
THREADS = 16      # per client, sharing its connection
ROUNDS = 2
TIMEOUT = 60.0    # each call's deadline
BOUND = dgmm.RetryPolicy().max_reconnect_wait + 2.0


class Caller:
    """One dgmm.Client shared by THREADS threads running small jobs back to
    back; every call is recorded as (start, end, error or None)."""

    def __init__(self, address, seed):
        eager = seed % 2 == 1
        retry = dgmm.RetryPolicy(max_attempts=64, initial_backoff=0.001, max_backoff=0.004) \
            if eager else None
        self.client = dgmm.Client(address, retry=retry)
        rng = np.random.default_rng(seed)
        self.a = rng.uniform(-2, 2, (16, 16)).astype(np.float32)
        self.d = rng.uniform(-2, 2, 16).astype(np.float32)
        self.calls = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop) for _ in range(THREADS)]

    def start(self):
        for t in self.threads:
            t.start()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        self.client.close()

    def successes(self):
        with self.lock:
            return sum(1 for c in self.calls if c[2] is None)

    def _loop(self):
        while not self.stop.is_set():
            start = time.monotonic()
            error = None
            try:
                c = self.client.multiply(self.a, self.d, timeout=TIMEOUT)
                if not np.array_equal(c, self.a * self.d):
                    error = "wrong result"
            except dgmm.DgmmError as e:
                error = e
            end = time.monotonic()
            with self.lock:
                self.calls.append((start, end, error))


class OpenStream:
    """A MultiplyStream call that sends nothing: the server waits for its
    header and counts it as a call in progress, so that its drain lasts its
    whole shutdown grace and it exits with the call open."""

    def __init__(self, address):
        self.channel = grpc.insecure_channel(address)
        self.release = threading.Event()

        def requests():
            self.release.wait()
            return
            yield  # a generator that yields nothing

        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.call = dgmm.pb_grpc.DgmmStub(self.channel).MultiplyStream(requests(), timeout=60)
        time.sleep(0.1)  # for its HEADERS to reach the server

    def close(self):
        self.release.set()
        self.call.cancel()
        self.channel.close()


class DrainTest(unittest.TestCase):
    def test_calls_sent_into_a_drain_end_within_the_reconnect_limit(self):
        in_window_total = 0
        for round_ in range(ROUNDS):
            with self.subTest(round=round_):
                in_window_total += self.run_round(round_)
        # The window was exercised: calls were sent while the server drained.
        self.assertGreaterEqual(in_window_total, CLIENTS * THREADS * ROUNDS)

    def run_round(self, round_):
        # The drain's defaults, written out: no per-connection queue
        # cap (with the old --max_queued_per_client=16, THREADS calls at a
        # time on one connection ended RESOURCE_EXHAUSTED before the drain).
        server = ServerProcess(flags=["--threads=2", "--max_queue=1024",
                                      "--max_queued_per_client=0"], prefix="dgmm-py-drain-")
        callers = [Caller(server.address, round_ * CLIENTS + i) for i in range(CLIENTS)]
        open_stream = None
        try:
            for c in callers:
                c.start()
            warm_limit = time.monotonic() + 30
            while time.monotonic() < warm_limit and min(c.successes() for c in callers) < 3:
                time.sleep(0.01)
            self.assertGreaterEqual(min(c.successes() for c in callers), 3,
                                    "not every client ran 3 jobs before the SIGTERM")
            open_stream = OpenStream(server.address)
            term = time.monotonic()
            server.process.terminate()
            server.process.wait(timeout=40)
            exited = time.monotonic()
            # Every call begun before the exit has ended by now unless it
            # hangs; the calls begun since (the server is gone) show that too.
            time.sleep(BOUND + 1)
        finally:
            for c in callers:
                c.join()
            if open_stream is not None:
                open_stream.close()
            server.stop()

        in_window = in_window_ok = after_exit = 0
        longest = (0.0, None, None)
        for i, c in enumerate(callers):
            for start, end, error in c.calls:
                took = end - start
                if took > longest[0]:
                    longest = (took, start - term, error)
                sent_in_window = term <= start < exited
                in_window += sent_in_window
                in_window_ok += sent_in_window and error is None
                after_exit += start >= exited
                what = ("client %d, sent %.3f s after the SIGTERM (the server exited after "
                        "%.3f s), took %.3f s: %s" % (i, start - term, exited - term, took, error))
                self.assertTrue(error is None or (isinstance(error, dgmm.DgmmError) and
                                                  error.code == grpc.StatusCode.UNAVAILABLE), what)
                self.assertLessEqual(took, BOUND, what)
                if start >= exited:
                    self.assertIsNotNone(error, what)
        print("\nround %d: drain window %.3f s; %d calls sent into it (%d OK), %d after the exit; "
              "longest call %.3f s (sent %.3f s after the SIGTERM: %s)"
              % (round_, exited - term, in_window, in_window_ok, after_exit, longest[0],
                 longest[1], longest[2]))
        return in_window


if __name__ == "__main__":
    unittest.main()
