"""MultiplyBatch on a GPU server, from the Python client: batches
of jobs for both GPU backends (cuda-kernel, cublas), every dtype, layout and
side, mixed with jobs for the CPU and with bad jobs, each result checked
against a float64 reference on fresh random data (each job's output is a
new array the client fills: NaN-free and equal to the reference, or its own
error). Afterwards nothing is reserved on any device.

Run on the GPU machine (ctest -L gpu: `python_batch_gpu`), or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server PYTHONPATH=build/python \\
    python3 tests/gpu/batch_gpu_test.py -v
Exits 77 (skipped) without grpcio/numpy or without a GPU in the server.
"""

import os
import sys
import time
import unittest

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SKIP = 77

try:
    import grpc
    import numpy as np
except ImportError as missing:
    print("SKIP: %s lacks grpcio/numpy (%s)" % (sys.executable, missing))
    sys.exit(SKIP)

sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess, reference, tolerance  # noqa: E402
import dgmm  # noqa: E402
from dgmm import pb  # noqa: E402

SERVER = None


def setUpModule():
    global SERVER
    SERVER = ServerProcess(flags=("--backend=auto",), start_timeout=120, stop_timeout=30,
                           prefix="dgmm-batch-gpu-")
    with dgmm.Client(SERVER.address) as client:
        info = client.server_info()
    if not any(d.index >= 0 for d in info.devices):
        SERVER.stop()
        print("dgmm-gpu-skip: no CUDA device in the server")
        sys.exit(SKIP)


def tearDownModule():
    if SERVER:
        SERVER.stop()


class BatchGpuTest(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        self.client = dgmm.Client(SERVER.address)

    def tearDown(self):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                d.reserved_bytes for d in self.client.server_info().devices):
            time.sleep(0.05)
        for d in self.client.server_info().devices:
            self.assertEqual(d.reserved_bytes, 0, d)
        self.client.close()

    def test_every_gpu_backend_dtype_layout_and_side_with_bad_jobs_between(self):
        jobs, expected = [], []
        for backend in ("cuda-kernel", "cublas", "cpu"):
            for dtype in (np.float32, np.float64):
                for order in "CF":
                    for side in ("right", "left"):
                        rows, cols = self.rng.integers(1, 90, 2)
                        a = np.asarray(self.rng.uniform(-4, 4, (rows, cols)).astype(dtype),
                                       order=order)
                        d = self.rng.uniform(-4, 4, cols if side == "right" else rows)
                        d = d.astype(dtype)
                        jobs.append((a, d, side, backend))
                        expected.append(reference(a, d, side))
                        # A diagonal one element short: that job's own error.
                        jobs.append((a, d[:-1] if len(d) > 1 else np.zeros(3, dtype), side,
                                     backend))
                        expected.append(None)
        results = self.client.multiply_batch(jobs, return_stats=True)
        self.assertEqual(len(results), len(jobs))
        gpu_jobs = 0
        for (a, _d, _side, backend), want, got in zip(jobs, expected, results):
            with self.subTest(backend=backend, dtype=a.dtype.name, shape=a.shape):
                if want is None:
                    self.assertIsInstance(got, dgmm.DgmmError)
                    self.assertEqual(got.code, grpc.StatusCode.INVALID_ARGUMENT)
                    continue
                self.assertNotIsInstance(got, Exception, got)
                c, stats = got
                self.assertFalse(np.isnan(c).any())
                np.testing.assert_allclose(c, want, rtol=tolerance(c.dtype), atol=0)
                if backend != "cpu":
                    self.assertGreaterEqual(stats.device_index, 0)
                    self.assertNotEqual(stats.backend, pb.BACKEND_CPU)
                    gpu_jobs += 1
        self.assertEqual(gpu_jobs, 16)


if __name__ == "__main__":
    unittest.main()
