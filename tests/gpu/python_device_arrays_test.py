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

    def host_any(self, shape, dtype, side):
        """Random A and d of `dtype` (complex with both parts random)."""
        def draw(size):
            x = self.rng.uniform(-4, 4, size)
            if np.dtype(dtype).kind == "c":
                x = x + 1j * self.rng.uniform(-4, 4, size)
            return x.astype(dtype)
        return draw(shape), draw(shape[1] if side == "right" else shape[0])

    def check_any(self, c_host, a, d, side):
        """float16: bit for bit against float32 arithmetic rounded once (the
        documented rule); complex: against complex128."""
        if a.dtype == np.float16:
            want = reference(a.astype(np.float32), d.astype(np.float32), side)
            want = want.astype(np.float32).astype(np.float16)
            np.testing.assert_array_equal(c_host.view(np.uint16), want.view(np.uint16))
            return
        want = (a.astype(np.complex128) * (d.astype(np.complex128)[None, :] if side == "right"
                                           else d.astype(np.complex128)[:, None]))
        self.assertFalse(np.isnan(c_host).any())
        np.testing.assert_allclose(c_host, want, rtol=1e-6 if a.dtype == np.complex64 else 1e-14,
                                   atol=0)

    @unittest.skipIf(CUPY is None, "no CuPy with a CUDA device")
    def test_cupy_half_and_complex(self):
        cp = CUPY
        for dtype in (np.float16, np.complex64, np.complex128):
            for side in ("right", "left"):
                for shape in ((257, 129), (1500, 1100)):  # unary and streamed
                    with self.subTest(dtype=np.dtype(dtype).name, side=side, shape=shape):
                        a, d = self.host_any(shape, dtype, side)
                        out = cp.full(shape, cp.nan, dtype=dtype)
                        c = self.client.multiply(cp.asarray(a), cp.asarray(d), side=side, out=out)
                        self.assertIs(c, out)
                        self.assertEqual(c.dtype, np.dtype(dtype))
                        self.check_any(cp.asnumpy(c), a, d, side)

    @unittest.skipIf(TORCH is None, "no PyTorch with a CUDA device")
    def test_torch_half_bfloat16_and_complex(self):
        torch = TORCH
        for dtype in (np.float16, np.complex64, np.complex128):
            for side in ("right", "left"):
                with self.subTest(dtype=np.dtype(dtype).name, side=side):
                    a, d = self.host_any((300, 170), dtype, side)
                    c = self.client.multiply(torch.from_numpy(a).cuda(), torch.from_numpy(d).cuda(),
                                             side=side)
                    self.assertIsInstance(c, torch.Tensor)
                    self.assertEqual(c.device.type, "cuda")
                    self.check_any(c.cpu().numpy(), a, d, side)
        try:
            import ml_dtypes  # noqa: F401
        except ImportError:
            with self.assertRaisesRegex(ValueError, "ml_dtypes"):
                self.client.multiply(torch.ones((3, 3), dtype=torch.bfloat16, device="cuda"),
                                     torch.ones(3, dtype=torch.bfloat16, device="cuda"))
            return
        # bfloat16: float32 arithmetic rounded once to bfloat16 (torch's own
        # rounding of a float32 product is that rule), bit for bit; values
        # that round, both sides, into a tensor given as out.
        for side in ("right", "left"):
            with self.subTest(dtype="bfloat16", side=side):
                a32 = torch.from_numpy(self.rng.uniform(-4, 4, (300, 170)).astype(np.float32))
                n = 170 if side == "right" else 300
                d32 = torch.from_numpy(self.rng.uniform(-4, 4, n).astype(np.float32))
                a, d = a32.to(torch.bfloat16), d32.to(torch.bfloat16)
                scale = d.float()[None, :] if side == "right" else d.float()[:, None]
                want = (a.float() * scale).to(torch.bfloat16)
                out = torch.full((300, 170), float("nan"), dtype=torch.bfloat16, device="cuda")
                c = self.client.multiply(a.cuda(), d.cuda(), side=side, out=out)
                self.assertIs(c, out)
                self.assertTrue(torch.equal(c.cpu().view(torch.int16), want.view(torch.int16)))
                # A host tensor in and out too.
                host_out = torch.full((300, 170), float("nan"), dtype=torch.bfloat16)
                c = self.client.multiply(a, d, side=side, out=host_out)
                self.assertIs(c, host_out)
                self.assertTrue(torch.equal(host_out.view(torch.int16), want.view(torch.int16)))

    @unittest.skipIf(TORCH is None, "no PyTorch with a CUDA device")
    def test_wrong_dtype_gets_the_same_error(self):
        torch = TORCH
        with self.assertRaisesRegex(ValueError, "float16, bfloat16 .*float32, float64, complex64 "
                                    "or complex128, got int32"):
            self.client.multiply(torch.ones((3, 3), dtype=torch.int32, device="cuda"),
                                 torch.ones(3, device="cuda"))


if __name__ == "__main__":
    unittest.main()
