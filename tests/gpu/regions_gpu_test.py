"""Regions on a GPU server, from the Python client: host regions
(sealed memfds passed by descriptor over the client's local-socket session,
the local socket) through the pipelined engine (pinned on reuse, device tiles only)
and CUDA IPC regions that this process (not the server) owns as CuPy arrays,
the kernel running on them in place on their GPU. Every job is checked
against a float64 reference on fresh random data, outputs poisoned (NaN)
before each job; registered and reserved bytes are back to 0 after each
test, and a Client's regions (host and IPC) go when it closes.

Run on the GPU machine (ctest -L gpu: `python_regions_gpu`), or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server PYTHONPATH=build/python \\
    python3 tests/gpu/regions_gpu_test.py -v
Exits 77 (skipped) without grpcio/numpy, without CuPy or a GPU here, or when
the server it starts has no GPU in service.
"""

import errno
import os
import time
import sys
import unittest

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SKIP = 77

try:
    import grpc
    import numpy as np
except ImportError as missing:
    print("SKIP: %s lacks grpcio/numpy (%s)" % (sys.executable, missing))
    sys.exit(SKIP)
try:
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no CUDA device")
except Exception as why:  # noqa: BLE001 - no CuPy, no driver or no device: skip.
    print("dgmm-gpu-skip: no CUDA device or no CuPy for %s (%s)" % (sys.executable, why))
    sys.exit(SKIP)

sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess, reference, tolerance  # noqa: E402
import dgmm  # noqa: E402
from dgmm import pb  # noqa: E402


class Server(ServerProcess):
    """dgmm-server with --allow_regions on the GPU, on an ephemeral port."""

    def __init__(self, *flags):
        super().__init__(flags=("--backend=auto", "--allow_regions", "--region_pin=reuse", *flags),
                         start_timeout=120, stop_timeout=30,  # CUDA start-up
                         prefix="dgmm-regions-gpu-")


SERVER = None
GPUS = []  # the server's GPU ordinals


def setUpModule():
    global SERVER
    SERVER = Server()
    with dgmm.Client(SERVER.address) as client:
        info = client.server_info()
    GPUS.extend(d.index for d in info.devices if d.index >= 0 and d.in_service)
    if not GPUS:
        SERVER.stop()
        print("dgmm-gpu-skip: no CUDA device in service on the server")
        sys.exit(SKIP)


def tearDownModule():
    if SERVER:
        SERVER.stop()


class GpuRegionTest(unittest.TestCase):
    def setUp(self):
        self.client = dgmm.Client(SERVER.address)
        self.rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        self.regions = []

    def tearDown(self):
        for region in self.regions:
            region.close()
        end = time.monotonic() + 10  # Sessions closed just now: the server drops their regions.
        while self.client.region_status().registered_bytes and time.monotonic() < end:
            time.sleep(0.05)
        status = self.client.region_status()
        info = self.client.server_info()
        self.client.close()
        self.assertEqual(list(status.regions), [])
        self.assertEqual(status.registered_bytes, 0)
        for device in info.devices:
            self.assertEqual(device.reserved_bytes, 0, device)

    def random(self, shape, dtype):
        return self.rng.uniform(-4, 4, shape).astype(dtype)

    def keep(self, region, name):
        self.regions.append(region)
        return region.register(self.client, name)

    def test_host_regions_run_through_the_pipelined_engine(self):
        # 4000 x 4000 float32 is 64 MB: many tiles of the pipeline.
        for dtype, order, side, n in ((np.float32, "C", "right", 4000),
                                      (np.float32, "F", "left", 3000),
                                      (np.float64, "C", "left", 2500),
                                      (np.float64, "F", "right", 2000)):
            with self.subTest(dtype=np.dtype(dtype).name, order=order, side=side, n=n):
                itemsize = np.dtype(dtype).itemsize
                shm = dgmm.SharedMemoryRegion(2 * n * n * itemsize)
                self.keep(shm, "host")
                status = self.client.region_status("host").regions[0]
                # Not pinned at registration: a first job streams through
                # the GPU's own pinned staging (pinned on reuse).
                self.assertFalse(status.pinned, status)
                self.assertTrue(status.sealed, status)  # A sealed memfd by default.
                self.assertGreater(status.register_ns, 0)
                a = shm.ndarray((n, n), dtype, order=order)
                c = shm.ndarray((n, n), dtype, offset=a.nbytes, order=order)
                a[:] = self.random((n, n), dtype)
                c[:] = np.nan
                d = self.random(n, dtype)
                stats = self.client.multiply_region(a, d, out=c, side=side)
                np.testing.assert_allclose(c, reference(a, d, side), rtol=tolerance(dtype),
                                           atol=0)
                self.assertIn(stats.device_index, GPUS)
                self.assertNotEqual(stats.backend, pb.BACKEND_CPU)
                self.assertGreater(stats.h2d_ns, 0)
                self.assertGreater(stats.d2h_ns, 0)
                self.assertEqual(stats.bytes_out, a.nbytes)
                # In place, through the same pinned region.
                before = a.copy()
                self.client.multiply_region(a, d, out=a, side=side)
                np.testing.assert_allclose(a, reference(before, d, side),
                                           rtol=tolerance(dtype), atol=0)
                # Reused: the server pins it in the background.
                self.wait_pinned("host")
                # Sealed: this process cannot shrink it under the server.
                with self.assertRaises(PermissionError) as raised:
                    os.ftruncate(shm.fd, 0)
                self.assertEqual(raised.exception.errno, errno.EPERM)
                c[:] = np.nan
                a[:] = self.random((n, n), dtype)
                self.client.multiply_region(a, d, out=c, side=side)
                np.testing.assert_allclose(c, reference(a, d, side), rtol=tolerance(dtype),
                                           atol=0)
                shm.close()
                self.regions.remove(shm)

    def wait_pinned(self, name, timeout_s=20):
        end = time.monotonic() + timeout_s
        while not self.client.region_status(name).regions[0].pinned:
            self.assertLess(time.monotonic(), end, "region %s was not pinned on reuse" % name)
            time.sleep(0.05)

    def test_shrunk_pinned_region_fails_the_job_not_the_server(self):
        # The client truncates its object (a POSIX object: a memfd of
        # SharedMemoryRegion is sealed) after the server mapped and pinned it:
        # the job must fail FAILED_PRECONDITION (the server checks the
        # object's size after every job), and the server must keep serving.
        n = 2000
        shm = dgmm.SharedMemoryRegion(2 * n * n * 4, key="/dgmm-gpu-shrink-%d" % os.getpid())
        self.assertFalse(shm.sealed)
        self.keep(shm, "shrink")
        a = shm.ndarray((n, n), np.float32)
        c = shm.ndarray((n, n), np.float32, offset=a.nbytes)
        a[:] = self.random((n, n), np.float32)
        d = self.random(n, np.float32)
        for _ in range(2):  # reused: pinned in the background
            self.client.multiply_region(a, d, out=c)
        self.wait_pinned("shrink")
        os.truncate(shm.path, 0)  # from here on, this process must not touch a or c
        with self.assertRaises(dgmm.DgmmError) as caught:
            self.client.multiply_region(a, d, out=c)
        self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION,
                         caught.exception)
        self.assertIn("shrank", caught.exception.details)
        del a, c
        shm.close()
        self.regions.remove(shm)
        # Still serving: a fresh region computes correctly.
        fresh = dgmm.SharedMemoryRegion(2 * n * n * 4)
        self.keep(fresh, "fresh")
        a = fresh.ndarray((n, n), np.float32)
        c = fresh.ndarray((n, n), np.float32, offset=a.nbytes)
        a[:] = self.random((n, n), np.float32)
        c[:] = np.nan
        self.client.multiply_region(a, d, out=c)
        np.testing.assert_allclose(c, reference(a, d, "right"), rtol=1e-6, atol=0)
        self.assertEqual(SERVER.process.poll(), None)

    def test_ipc_regions_owned_by_this_process_run_in_place_on_their_gpu(self):
        device = GPUS[0]
        with cupy.cuda.Device(device):
            for dtype, order, side, (rows, cols) in (
                    (np.float32, "C", "right", (3000, 2000)),
                    (np.float32, "F", "left", (1000, 3000)),
                    (np.float64, "C", "left", (1500, 1700)),
                    (np.float64, "F", "right", (1200, 800))):
                with self.subTest(dtype=np.dtype(dtype).name, order=order, side=side):
                    a_host = self.random((rows, cols), dtype)
                    d_host = self.random(cols if side == "right" else rows, dtype)
                    want = reference(a_host, d_host, side)
                    a = cupy.asarray(a_host, order=order)
                    c = cupy.full((rows, cols), cupy.nan, dtype=dtype, order=order)
                    self.assertEqual(dgmm.CudaIpcRegion(a).local_device, device)
                    a_region = dgmm.CudaIpcRegion(a, device=device)
                    c_region = dgmm.CudaIpcRegion(c, device=device)
                    self.keep(a_region, "a")
                    self.keep(c_region, "c")
                    status = self.client.region_status("a").regions[0]
                    self.assertEqual((status.kind, status.device, status.byte_size),
                                     (pb.REGION_KIND_CUDA_IPC, device, a.nbytes))
                    stats = self.client.multiply_region(a, d_host, out=c, side=side)
                    cupy.cuda.runtime.deviceSynchronize()
                    np.testing.assert_allclose(cupy.asnumpy(c), want, rtol=tolerance(dtype),
                                               atol=0)
                    np.testing.assert_array_equal(cupy.asnumpy(a), a_host)
                    self.assertEqual(stats.device_index, device)
                    self.assertEqual((stats.h2d_ns, stats.d2h_ns), (0, 0))  # No PCIe.
                    self.assertEqual(stats.bytes_out, a.nbytes)
                    # In place, the diagonal a CuPy array (the client sends it inline).
                    d = cupy.asarray(d_host)
                    stats = self.client.multiply_region(a, d, out=a, side=side)
                    cupy.cuda.runtime.deviceSynchronize()
                    np.testing.assert_allclose(cupy.asnumpy(a), want, rtol=tolerance(dtype),
                                               atol=0)
                    self.assertEqual(stats.bytes_in, a.nbytes)  # The matrix only.
                    for region in self.regions:
                        region.close()
                    self.regions.clear()

    def test_regions_of_a_closed_client_are_dropped(self):
        # Host and IPC regions alike go with their Client's session.
        device = GPUS[0]
        other = dgmm.Client(SERVER.address)
        try:
            with cupy.cuda.Device(device):
                a = cupy.asarray(self.random((300, 200), np.float32))
            ipc = dgmm.CudaIpcRegion(a, device=device).register(other, "closing-ipc")
            shm = dgmm.SharedMemoryRegion(300 * 200 * 4).register(other, "closing-host")
            names = sorted(r.name for r in self.client.region_status().regions)
            self.assertEqual(names, ["closing-host", "closing-ipc"])
            self.assertEqual({r.owner_uid for r in self.client.region_status().regions},
                             {os.getuid()})
        finally:
            other.close()
        self.assertFalse(ipc.registered or shm.registered)
        end = time.monotonic() + 10
        while self.client.region_status().regions and time.monotonic() < end:
            time.sleep(0.05)
        self.assertEqual(list(self.client.region_status().regions), [])
        shm.close()
        ipc.close()

    def test_ipc_view_inside_a_pool_allocation(self):
        # Two arrays carved out of one allocation: the handle is the
        # allocation's, the offsets tell them apart.
        device = GPUS[0]
        with cupy.cuda.Device(device):
            block = cupy.full(2 * 500 * 300 + 16, cupy.nan, dtype=cupy.float32)
            a = block[16:16 + 500 * 300].reshape(500, 300)
            c = block[16 + 500 * 300:].reshape(500, 300)
            a_host = self.random((500, 300), np.float32)
            a[...] = cupy.asarray(a_host)
            whole = dgmm.CudaIpcRegion(block, device=device)
            self.keep(whole, "block")
            self.assertEqual(dgmm.CudaIpcRegion(a).offset - whole.offset, 16 * 4)
            d_host = self.random(300, np.float32)
            self.client.multiply_region(a, d_host, out=c)
            cupy.cuda.runtime.deviceSynchronize()
            np.testing.assert_allclose(cupy.asnumpy(c), reference(a_host, d_host, "right"),
                                       rtol=1e-6, atol=0)
            # The same allocation as two more regions: the server opens its
            # handle again (CUDA counts the opens) and closes it per region.
            whole.close()
            self.regions.remove(whole)
            a_region, c_region = dgmm.CudaIpcRegion(a), dgmm.CudaIpcRegion(c)
            self.assertEqual(a_region.handle, c_region.handle)
            self.keep(a_region, "part-a")
            self.keep(c_region, "part-c")
            c.fill(cupy.nan)
            self.client.multiply_region(a, d_host, out=c, side="right")
            cupy.cuda.runtime.deviceSynchronize()
            np.testing.assert_allclose(cupy.asnumpy(c), reference(a_host, d_host, "right"),
                                       rtol=1e-6, atol=0)
            a_region.close()  # Closing one must leave the other usable.
            c[...] = cupy.asarray(a_host)
            header = pb.JobHeader(rows=500, cols=300, dtype=pb.DTYPE_FLOAT32,
                                  diagonal=d_host.tobytes())
            self.client.multiply_region_refs(header, c_region.ref(0), c_region.ref(0))
            cupy.cuda.runtime.deviceSynchronize()
            np.testing.assert_allclose(cupy.asnumpy(c), reference(a_host, d_host, "right"),
                                       rtol=1e-6, atol=0)

    def test_torch_tensors_work_through_the_cuda_array_interface(self):
        try:
            import torch
        except ImportError:
            self.skipTest("no PyTorch")
        device = GPUS[0]
        a_host = self.random((700, 500), np.float32)
        d_host = self.random(700, np.float32)
        a = torch.from_numpy(a_host).to("cuda:%d" % device)
        c = torch.full((700, 500), float("nan"), device="cuda:%d" % device)
        self.keep(dgmm.CudaIpcRegion(a, device=device), "ta")
        self.keep(dgmm.CudaIpcRegion(c, device=device), "tc")
        self.client.multiply_region(a, d_host, out=c, side="left")
        torch.cuda.synchronize(device)
        np.testing.assert_allclose(c.cpu().numpy(), reference(a_host, d_host, "left"),
                                   rtol=1e-6, atol=0)

    def test_bad_ipc_inputs(self):
        device = GPUS[0]
        with cupy.cuda.Device(device):
            a = cupy.ones((64, 64), dtype=cupy.float32)
        region = dgmm.CudaIpcRegion(a, device=device)
        for bad_device in (max(GPUS) + 1, -1):
            with self.subTest(device=bad_device):
                region.device = bad_device
                with self.assertRaises(dgmm.DgmmError) as raised:
                    region.register(self.client, "bad")
                self.assertIn(raised.exception.code, (grpc.StatusCode.FAILED_PRECONDITION,
                                                      grpc.StatusCode.INVALID_ARGUMENT))
        region.device = device
        for handle in (region.handle[:63], bytes(64)):
            with self.subTest(handle=len(handle)):
                request = pb.RegisterRegionRequest(name="h", cuda_ipc=pb.CudaIpcRegion(
                    handle=handle, device=device, offset=0, byte_size=4096))
                with self.assertRaises(grpc.RpcError) as raised:
                    self.client._stub.RegisterRegion(
                        request, metadata=self.client.local_session().metadata())
                self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        # A diagonal in an IPC region: the server takes none (send it inline).
        with cupy.cuda.Device(device):
            d = cupy.ones(64, dtype=cupy.float32)
        d_region = dgmm.CudaIpcRegion(d, device=device)
        self.keep(d_region, "ipc-d")
        self.keep(region, "ipc")
        header = pb.JobHeader(rows=64, cols=64, dtype=pb.DTYPE_FLOAT32)
        with self.assertRaises(dgmm.DgmmError) as raised:
            self.client.multiply_region_refs(header, region.ref(0), region.ref(0),
                                             d_region.ref(0))
        self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        # A job mixing a host region and an IPC region.
        shm = dgmm.SharedMemoryRegion(64 * 64 * 4)
        self.keep(shm, "shm")
        header = pb.JobHeader(rows=64, cols=64, dtype=pb.DTYPE_FLOAT32,
                              diagonal=np.ones(64, np.float32).tobytes())
        with self.assertRaises(dgmm.DgmmError) as raised:
            self.client.multiply_region_refs(header, region.ref(0), shm.ref(0))
        self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)


if __name__ == "__main__":
    unittest.main()
