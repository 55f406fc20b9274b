"""CuPy and PyTorch arrays through dgmm.Client.multiply (label gpu).

The client copies a CUDA A (and d) to the host, runs the job, and returns C
as the same kind of array on A's device (out= may be a CUDA array of A's
shape). Checked against a float64 NumPy reference on fresh random data, with
every output poisoned first. Exits 77 (skip) without CuPy or PyTorch with a
usable GPU; each library is tested when present.

  DGMM_SERVER_BIN=build/service/dgmm-server PYTHONPATH=build/python \\
    python3 tests/gpu/python_device_arrays_test.py -v
"""

import os
import sys
import unittest

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SKIP = 77

try:
    import numpy as np
except ImportError:
    print("dgmm-gpu-skip: %s has no NumPy" % sys.executable)
    sys.exit(SKIP)


def _cupy():
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # noqa: BLE001 - no CuPy, no driver or no device: not this library
        return None


def _torch():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


CUPY, TORCH = _cupy(), _torch()
if __name__ == "__main__" and CUPY is None and TORCH is None:
    print("dgmm-gpu-skip: neither CuPy nor PyTorch with a CUDA device in %s" % sys.executable)
    sys.exit(SKIP)

sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess, reference, tolerance  # noqa: E402
import dgmm  # noqa: E402

SERVER = None


def setUpModule():
    global SERVER
    # The server's own backend choice (its GPU when it has one).
    SERVER = ServerProcess(backend=None, start_timeout=120, prefix="dgmm-py-gpu-")


def tearDownModule():
    if SERVER:
        SERVER.stop()


class DeviceArraysTest(unittest.TestCase):
    def setUp(self):
        self.client = dgmm.Client(SERVER.address)
        self.rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))

    def tearDown(self):
        self.client.close()

    def host_job(self, shape, dtype, order, side):
        a = np.asarray(self.rng.uniform(-4, 4, shape), dtype=dtype, order=order)
        d = self.rng.uniform(-4, 4, shape[1] if side == "right" else shape[0]).astype(dtype)
        return a, d

    def check(self, c_host, a, d, side):
        self.assertFalse(np.isnan(c_host).any(), "lines were never filled in")
        np.testing.assert_allclose(c_host, reference(a, d, side), rtol=tolerance(a.dtype), atol=0)

    @unittest.skipIf(CUPY is None, "no CuPy with a CUDA device")
    def test_cupy_in_cupy_out(self):
        cp = CUPY
        for dtype in (np.float32, np.float64):
            for order in "CF":
                for side in ("right", "left"):
                    for shape in ((257, 129), (1500, 1100)):  # unary and streamed
                        with self.subTest(dtype=dtype.__name__, order=order, side=side,
                                          shape=shape):
                            a, d = self.host_job(shape, dtype, order, side)
                            a_dev, d_dev = cp.asarray(a, order=order), cp.asarray(d)
                            c = self.client.multiply(a_dev, d_dev, side=side)
                            self.assertIsInstance(c, cp.ndarray)
                            self.assertEqual(c.dtype, a.dtype)
                            self.assertEqual(c.shape, a.shape)
                            self.assertEqual(c.device.id, a_dev.device.id)
                            self.assertTrue(c.flags[order + "_CONTIGUOUS"])
                            self.check(cp.asnumpy(c), a, d, side)

    @unittest.skipIf(CUPY is None, "no CuPy with a CUDA device")
    def test_cupy_out_is_filled_in_place(self):
        cp = CUPY
        a, d = self.host_job((600, 400), np.float32, "C", "right")
        out = cp.full(a.shape, cp.nan, dtype=cp.float32)
        c = self.client.multiply(cp.asarray(a), d, out=out)
        self.assertIs(c, out)
        self.check(cp.asnumpy(out), a, d, "right")

    @unittest.skipIf(TORCH is None, "no PyTorch with a CUDA device")
    def test_torch_in_torch_out(self):
        torch = TORCH
        for dtype in (np.float32, np.float64):
            for side in ("right", "left"):
                for shape in ((257, 129), (1500, 1100)):
                    with self.subTest(dtype=dtype.__name__, side=side, shape=shape):
                        a, d = self.host_job(shape, dtype, "C", side)
                        a_dev = torch.from_numpy(a).cuda()
                        d_dev = torch.from_numpy(d).cuda()
                        c = self.client.multiply(a_dev, d_dev, side=side)
                        self.assertIsInstance(c, torch.Tensor)
                        self.assertEqual(c.device, a_dev.device)
                        self.assertEqual(c.dtype, a_dev.dtype)
                        self.assertEqual(tuple(c.shape), a.shape)
                        self.check(c.cpu().numpy(), a, d, side)

    @unittest.skipIf(TORCH is None, "no PyTorch with a CUDA device")
    def test_torch_out_is_filled_in_place(self):
        torch = TORCH
        a, d = self.host_job((600, 400), np.float64, "C", "left")
        out = torch.full(a.shape, float("nan"), dtype=torch.float64, device="cuda")
        c = self.client.multiply(torch.from_numpy(a).cuda(), torch.from_numpy(d), side="left",
                                 out=out)
        self.assertIs(c, out)
        self.check(out.cpu().numpy(), a, d, "left")

    @unittest.skipIf(TORCH is None, "no PyTorch with a CUDA device")
    def test_wrong_dtype_gets_the_same_error(self):
        torch = TORCH
        with self.assertRaisesRegex(ValueError, "float16, bfloat16 .*float32, float64, complex64 "
                                    "or complex128, got int32"):
            self.client.multiply(torch.ones((3, 3), dtype=torch.int32, device="cuda"),
                                 torch.ones(3, device="cuda"))


if __name__ == "__main__":
    unittest.main()
