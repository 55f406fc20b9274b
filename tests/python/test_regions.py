"""dgmm.regions (client/python/dgmm/regions.py) against the real CPU server
with --allow_regions: jobs on NumPy views of shared memory, checked against
a float64 reference on fresh random data with outputs poisoned (NaN)
before each job; in place; the diagonal in a region; bad inputs with their
status codes; and registered and reserved bytes back to 0 after every path.

Run by ctest (test `python_regions`), or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server build/python-venv/bin/python \\
    /usr/bin/python3 tests/python/test_regions.py -v
Exits 77 (ctest's skip code) when this interpreter lacks grpcio/numpy. The
CUDA IPC part needs a GPU server: tests/gpu/regions_gpu_test.py.
"""

import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

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

sys.path.insert(0, os.path.join(REPO, "tests", "support"))
from dgmm_server import ServerProcess, reference, tolerance  # noqa: E402
import dgmm  # noqa: E402
from dgmm import pb  # noqa: E402

MIB = 1 << 20


class Server(ServerProcess):
    """dgmm-server (CPU backend, 2 threads) on an ephemeral loopback port."""

    def __init__(self, *flags):
        super().__init__(flags=("--threads=2", *flags), prefix="dgmm-py-regions-")


SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server("--allow_regions", "--region_memory_budget=64MiB",
                    "--max_regions_per_client=6")


def tearDownModule():
    if SERVER:
        SERVER.stop()


def wait_until(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


class RegionTestCase(unittest.TestCase):
    server = None  # None: the module's SERVER

    def setUp(self):
        self.client = dgmm.Client((self.server or SERVER).address)
        self.rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        self.regions = []

    def tearDown(self):
        for region in self.regions:
            region.close()
        try:
            status = self.client.region_status()
            info = self.client.server_info()
        finally:
            self.client.close()
        # Every path leaves nothing registered and nothing reserved.
        self.assertEqual(list(status.regions), [])
        self.assertEqual(status.registered_bytes, 0)
        for device in info.devices:
            self.assertEqual(device.reserved_bytes, 0, device)

    def shm(self, byte_size, name=None, **kwargs):
        region = dgmm.SharedMemoryRegion(byte_size, **kwargs)
        self.regions.append(region)
        if name:
            region.register(self.client, name)
        return region

    def random(self, shape, dtype):
        return self.rng.uniform(-4, 4, shape).astype(dtype)

    def assertCode(self, code, call, *args, **kwargs):
        with self.assertRaises(dgmm.DgmmError) as raised:
            call(*args, **kwargs)
        self.assertEqual(raised.exception.code, code, raised.exception.details)
        self.assertTrue(raised.exception.details)
        return raised.exception


class RegionJobTest(RegionTestCase):
    def test_server_says_regions_are_on_with_the_limits_it_was_given(self):
        limits = self.client.server_info().limits
        self.assertTrue(limits.regions_enabled)
        self.assertEqual(limits.region_budget_bytes, 64 * MIB)
        self.assertEqual(limits.max_regions_per_client, 6)

    def test_round_trips_for_every_dtype_layout_and_side(self):
        rows, cols = 67, 41
        shm = self.shm(2 * rows * cols * 8 + 4096, "jobs")
        status = self.client.region_status("jobs")
        self.assertEqual(len(status.regions), 1)
        region = status.regions[0]
        self.assertEqual((region.kind, region.key, region.byte_size, region.device),
                         (pb.REGION_KIND_SYSTEM_SHM, shm.key, shm.byte_size, -1))
        self.assertEqual(status.registered_bytes, shm.byte_size)
        jobs = 0
        for dtype in (np.float32, np.float64):
            for order in "CF":
                for side in ("right", "left"):
                    with self.subTest(dtype=dtype.__name__, order=order, side=side):
                        a = shm.ndarray((rows, cols), dtype, order=order)
                        # The result at an offset that is not a multiple of the row size.
                        c = shm.ndarray((rows, cols), dtype, offset=a.nbytes + 64, order=order)
                        a[:] = self.random((rows, cols), dtype)
                        c[:] = np.nan
                        d = self.random(cols if side == "right" else rows, dtype)
                        before = a.copy()
                        stats = self.client.multiply_region(a, d, out=c, side=side)
                        jobs += 1
                        np.testing.assert_allclose(c, reference(before, d, side),
                                                   rtol=tolerance(dtype), atol=0)
                        np.testing.assert_array_equal(a, before)  # A is only read.
                        self.assertEqual(stats.bytes_out, a.nbytes)
                        self.assertEqual(stats.bytes_in, a.nbytes)
                        self.assertEqual(stats.backend, pb.BACKEND_CPU)
                        self.assertGreater(stats.total_ns, 0)
        self.assertEqual(self.client.region_status("jobs").regions[0].jobs_total, jobs)

    def test_in_place(self):
        for dtype, order, side in ((np.float64, "C", "right"), (np.float32, "F", "left")):
            with self.subTest(dtype=dtype.__name__, order=order, side=side):
                shm = self.shm(300 * 200 * 8, "inplace-%s" % order)
                a = shm.ndarray((300, 200), dtype, order=order)
                a[:] = self.random((300, 200), dtype)
                before = a.copy()
                d = self.random(200 if side == "right" else 300, dtype)
                stats = self.client.multiply_region(a, d, out=a, side=side)
                np.testing.assert_allclose(a, reference(before, d, side),
                                           rtol=tolerance(dtype), atol=0)
                self.assertEqual(stats.bytes_out, a.nbytes)
                shm.close()

    def test_diagonal_in_a_region_and_operands_in_two_regions(self):
        rows, cols = 120, 90
        inputs = self.shm(rows * cols * 8 + cols * 8, "inputs")
        outputs = self.shm(rows * cols * 8, "outputs")
        a = inputs.ndarray((rows, cols), np.float64)
        d = inputs.ndarray((cols,), np.float64, offset=a.nbytes)
        c = outputs.ndarray((rows, cols), np.float64)
        a[:] = self.random((rows, cols), np.float64)
        d[:] = self.random(cols, np.float64)
        c[:] = np.nan
        stats = self.client.multiply_region(a, d, out=c)
        np.testing.assert_allclose(c, reference(a, d, "right"), rtol=tolerance(np.float64), atol=0)
        # bytes_in counts the matrix (as for inline diagonals), not the diagonal's bytes.
        self.assertEqual((stats.bytes_in, stats.bytes_out), (a.nbytes, a.nbytes))
        # The diagonal is read from the region at job time: change it there.
        d[:] = self.random(cols, np.float64)
        c[:] = np.nan
        self.client.multiply_region(a, d, out=c)
        np.testing.assert_allclose(c, reference(a, d, "right"), rtol=tolerance(np.float64), atol=0)

    def test_refs_at_offsets_into_a_range_registered_at_an_offset(self):
        rows, cols = 33, 17
        shm = self.shm(8192 + 2 * rows * cols * 4 + 64)
        shm.register(self.client, "ranged", offset=8192)
        self.assertEqual(self.client.region_status("ranged").regions[0].offset, 8192)
        a = shm.ndarray((rows, cols), np.float32, offset=8192 + 4 * 3)
        c = shm.ndarray((rows, cols), np.float32, offset=8192 + a.nbytes + 4 * 3)
        a[:] = self.random((rows, cols), np.float32)
        c[:] = np.nan
        d = self.random(rows, np.float32)
        header = pb.JobHeader(rows=rows, cols=cols, dtype=pb.DTYPE_FLOAT32,
                              layout=pb.LAYOUT_ROW_MAJOR, side=pb.SIDE_LEFT,
                              diagonal=d.tobytes())
        self.client.multiply_region_refs(header, shm.ref(12), shm.ref(12 + a.nbytes))
        np.testing.assert_allclose(c, reference(a, d, "left"), rtol=1e-6, atol=0)
        # The same job through the array API finds the same refs.
        c[:] = np.nan
        self.client.multiply_region(a, d, out=c, side="left")
        np.testing.assert_allclose(c, reference(a, d, "left"), rtol=1e-6, atol=0)

    def test_a_job_of_many_blocks_is_right(self):
        # 2000 x 1500 float64 (24 MB): several blocks of the thread pool.
        shm = self.shm(2000 * 1500 * 8, "big")
        a = shm.ndarray((2000, 1500), np.float64)
        a[:] = self.random((2000, 1500), np.float64)
        before = a.copy()
        d = self.random(1500, np.float64)
        self.client.multiply_region(a, d, out=a)
        np.testing.assert_allclose(a, reference(before, d, "right"), rtol=tolerance(np.float64), atol=0)

    def test_unregister_and_reregister_under_the_same_name(self):
        shm = self.shm(4096, "again")
        self.assertTrue(shm.unregister())
        self.assertFalse(shm.registered)
        shm.register(self.client, "again")
        self.assertEqual(self.client.unregister_regions(), 1)
        self.assertFalse(shm.registered)
        self.assertFalse(shm.unregister())


class BadInputTest(RegionTestCase):
    def register_raw(self, name, key, offset=0, byte_size=4096):
        return self.client._stub.RegisterRegion(pb.RegisterRegionRequest(
            name=name, system_shm=pb.SystemShmRegion(key=key, offset=offset,
                                                     byte_size=byte_size)))

    def raw(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except grpc.RpcError as e:
            raise dgmm.DgmmError.from_rpc_error(e) from None

    def test_names_and_keys_are_validated(self):
        shm = self.shm(4096)
        for name in ("", "a/b", "../x", "x" * 65, "sp ace"):
            with self.subTest(name=name):
                self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.raw, self.register_raw,
                                name, shm.key)
        for key in ("/", "/.", "/..", "/a/b", "dev/shm/x", shm.path, "/" + "k" * 201):
            with self.subTest(key=key):
                self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.raw, self.register_raw,
                                "k", key)
        # The client refuses them before sending.
        with self.assertRaisesRegex(ValueError, "region name"):
            shm.register(self.client, "a/b")
        with self.assertRaisesRegex(ValueError, "shared-memory key"):
            dgmm.SharedMemoryRegion(64, key="/../etc")

    def test_ranges_are_checked_against_the_objects_real_size(self):
        shm = self.shm(4096)
        for offset, size in ((0, 4097), (4000, 97), (-1, 10), (0, 0), (0, -5)):
            with self.subTest(offset=offset, size=size):
                self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.raw, self.register_raw,
                                "r", shm.key, offset, size)
        self.raw(self.register_raw, "r", shm.key, 96, 4000)  # Exactly to the end: fine.
        self.raw(self.client._stub.UnregisterRegion, pb.UnregisterRegionRequest(name="r"))

    def test_a_key_that_does_not_exist_is_not_found(self):
        self.assertCode(grpc.StatusCode.NOT_FOUND, self.raw, self.register_raw,
                        "gone", "/dgmm-py-no-such-object-%d" % os.getpid())

    def test_a_second_region_of_the_same_name_already_exists(self):
        self.shm(4096, "twice")
        other = self.shm(4096)
        self.assertCode(grpc.StatusCode.ALREADY_EXISTS, other.register, self.client, "twice")
        self.assertFalse(other.registered)

    def test_more_regions_than_the_per_client_limit(self):
        for i in range(6):
            self.shm(4096, "n%d" % i)
        self.assertCode(grpc.StatusCode.RESOURCE_EXHAUSTED, self.shm(4096).register,
                        self.client, "n6")

    def test_more_bytes_than_the_budget(self):
        shm = self.shm(40 * MIB, "first")
        self.assertCode(grpc.StatusCode.RESOURCE_EXHAUSTED, self.shm(30 * MIB).register,
                        self.client, "second")
        self.assertEqual(self.client.region_status().registered_bytes, 40 * MIB)
        shm.close()

    def test_job_ranges_outside_the_region_and_partial_overlap(self):
        shm = self.shm(64 * 64 * 8, "small")
        header = pb.JobHeader(rows=64, cols=64, dtype=pb.DTYPE_FLOAT64,
                              diagonal=np.ones(64).tobytes())
        self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.client.multiply_region_refs,
                        header, shm.ref(8), shm.ref(0))
        self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.client.multiply_region_refs,
                        header, shm.ref(0), shm.ref(-8))
        small = pb.JobHeader(rows=16, cols=16, dtype=pb.DTYPE_FLOAT64,
                             diagonal=np.ones(16).tobytes())
        self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.client.multiply_region_refs,
                        small, shm.ref(0), shm.ref(8))  # Overlaps, not the same place.
        self.assertCode(grpc.StatusCode.NOT_FOUND, self.client.multiply_region_refs,
                        small, shm.ref(0), pb.RegionRef(name="nowhere", offset=0))
        # The diagonal both inline and in a region.
        self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.client.multiply_region_refs,
                        small, shm.ref(0), shm.ref(4096), shm.ref(8192))
        # A wrong inline diagonal length.
        bad = pb.JobHeader(rows=16, cols=16, dtype=pb.DTYPE_FLOAT64,
                           diagonal=np.ones(15).tobytes())
        self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.client.multiply_region_refs,
                        bad, shm.ref(0), shm.ref(4096))

    def test_another_tokens_regions_are_not_found(self):
        # With tokens on, a region belongs to the token that registered it.
        with tempfile.TemporaryDirectory() as tmp:
            token_file = os.path.join(tmp, "tokens")
            with open(token_file, "w") as f:
                f.write("token-one-%s\ntoken-two-%s\n" % (os.urandom(8).hex(), os.urandom(8).hex()))
            with open(token_file) as f:
                one, two = f.read().split()
            server = Server("--allow_regions", "--auth_token_file=" + token_file)
        mine = dgmm.Client(server.address, token=one)
        other = dgmm.Client(server.address, token=two)
        shm = dgmm.SharedMemoryRegion(64 * 64 * 8)
        try:
            shm.register(mine, "mine")
            a = shm.ndarray((8, 8), np.float64)
            a[:] = self.random((8, 8), np.float64)
            small = pb.JobHeader(rows=8, cols=8, dtype=pb.DTYPE_FLOAT64,
                                 diagonal=np.ones(8).tobytes())
            self.assertCode(grpc.StatusCode.NOT_FOUND, other.multiply_region_refs,
                            small, shm.ref(0), shm.ref(0))
            self.assertCode(grpc.StatusCode.NOT_FOUND, other.region_status, "mine")
            self.assertEqual(list(other.region_status().regions), [])
            self.assertEqual(other.unregister_regions(), 0)
            self.assertEqual([r.name for r in mine.region_status().regions], ["mine"])
            # The owner's job runs; the same name is free for the other token.
            mine.multiply_region_refs(small, shm.ref(0), shm.ref(0))
            other_shm = dgmm.SharedMemoryRegion(4096)
            other_shm.register(other, "mine")
            other_shm.close()
            shm.close()
            self.assertEqual(mine.region_status().registered_bytes, 0)
            anonymous = dgmm.Client(server.address)
            self.assertCode(grpc.StatusCode.UNAUTHENTICATED, anonymous.region_status)
            anonymous.close()
        finally:
            shm.close()
            mine.close()
            other.close()
            server.stop()

    def test_arrays_the_client_cannot_place_are_refused_before_sending(self):
        shm = self.shm(2 * 10 * 10 * 8, "place")
        a = shm.ndarray((10, 10), np.float64)
        a[:] = 1
        with self.assertRaisesRegex(ValueError, "not in a region"):
            self.client.multiply_region(np.ones((10, 10)), np.ones(10), out=a)
        with self.assertRaisesRegex(ValueError, "out must have"):
            self.client.multiply_region(a, np.ones(10),
                                        out=shm.ndarray((10, 10), np.float32, offset=800))
        with self.assertRaisesRegex(ValueError, "out must have"):
            self.client.multiply_region(a, np.ones(10),
                                        out=shm.ndarray((10, 10), np.float64, 800, order="F"))
        with self.assertRaisesRegex(ValueError, "contiguous"):
            self.client.multiply_region(a[:, ::2], np.ones(5), out=a[:, ::2])
        with self.assertRaisesRegex(ValueError, "float32 or float64"):
            self.client.multiply_region(shm.ndarray((10, 10), np.int64), np.ones(10),
                                        out=shm.ndarray((10, 10), np.int64))

    def test_cuda_ipc_on_a_cpu_server_is_failed_precondition(self):
        request = pb.RegisterRegionRequest(name="gpu", cuda_ipc=pb.CudaIpcRegion(
            handle=os.urandom(64), device=0, offset=0, byte_size=4096))
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, self.raw,
                        self.client._stub.RegisterRegion, request)


class ShmLifecycleTest(RegionTestCase):
    def test_an_unlinked_object_is_dropped_by_the_servers_sweep(self):
        shm = self.shm(1 * MIB, "orphan")
        self.assertEqual(self.client.region_status().registered_bytes, MIB)
        os.unlink(shm.path)  # As a client that exits without unregistering does.
        self.assertTrue(wait_until(
            lambda: self.client.region_status().registered_bytes == 0, 5),
            "the region of an unlinked object is still registered after 5 s")
        shm.client = shm.name = None  # The server dropped it; nothing to unregister.

    def test_a_client_process_that_exits_without_unregistering_leaks_nothing(self):
        child = subprocess.run([sys.executable, "-c", (
            "import sys, dgmm, os\n"
            "client = dgmm.Client(sys.argv[1])\n"
            "shm = dgmm.SharedMemoryRegion(1 << 20).register(client, 'child')\n"
            "print(client.region_status().registered_bytes, flush=True)\n"
            "os._exit(0)\n"), SERVER.address], capture_output=True, text=True,
            timeout=60)
        self.assertEqual(child.returncode, 0, child.stderr)
        self.assertEqual(child.stdout.split(), [str(MIB)])
        # os._exit skips the unlink at exit: the object stays in /dev/shm, and
        # its region with it (until --region_idle_timeout_s), until someone
        # unlinks it; here the test does, as a supervisor cleaning up would.
        status = self.client.region_status()  # Same peer address: same client.
        self.assertEqual([r.name for r in status.regions], ["child"])
        os.unlink("/dev/shm" + status.regions[0].key)
        self.assertTrue(wait_until(
            lambda: self.client.region_status().registered_bytes == 0, 5))

    def test_a_shrunk_object_fails_the_job_and_the_server_lives(self):
        shm = self.shm(64 * 64 * 8, "shrink")
        a = shm.ndarray((64, 64), np.float64)
        a[:] = 1
        del a
        os.truncate(shm.path, 0)
        header = pb.JobHeader(rows=64, cols=64, dtype=pb.DTYPE_FLOAT64,
                              diagonal=np.ones(64).tobytes())
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, self.client.multiply_region_refs,
                        header, shm.ref(0), shm.ref(0))
        self.assertIsNone(SERVER.process.poll())
        self.assertEqual(self.client.health(), "SERVING")
        shm.close()  # Unregisters: the region was unusable, not gone.

    def test_unregister_while_a_job_runs_lets_it_finish(self):
        rows, cols = 4000, 4000  # 128 MB of float64 on one thread: tens of ms.
        server = Server("--allow_regions", "--region_memory_budget=256MiB", "--threads=1")
        client = dgmm.Client(server.address)
        try:
            shm = dgmm.SharedMemoryRegion(rows * cols * 8)
            self.regions.append(shm)
            shm.register(client, "busy")
            a = shm.ndarray((rows, cols), np.float64)
            a[:] = self.random((rows, cols), np.float64)
            before = a.copy()
            d = self.random(cols, np.float64)
            result = {}

            def job():
                try:
                    result["stats"] = client.multiply_region(a, d, out=a)
                except dgmm.DgmmError as e:
                    result["error"] = e

            thread = threading.Thread(target=job)
            thread.start()
            seen = False
            while thread.is_alive() and not seen:
                seen = client.region_status("busy").regions[0].jobs_in_use > 0
            if not seen:
                thread.join()
                self.skipTest("the job ended before the test saw it running")
            self.assertTrue(shm.unregister())  # The name is gone at once...
            self.assertCode(grpc.StatusCode.NOT_FOUND, client.region_status, "busy")
            thread.join(60)
            self.assertNotIn("error", result)  # ...and the job ends normally.
            np.testing.assert_allclose(a, reference(before, d, "right"), rtol=tolerance(np.float64), atol=0)
            self.assertTrue(wait_until(lambda: client.region_status().registered_bytes == 0, 5))
        finally:
            client.close()
            server.stop()


class RegionsOffTest(RegionTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def tearDown(self):
        for region in self.regions:
            region.close()
        self.client.close()

    def test_every_region_rpc_is_failed_precondition(self):
        self.assertFalse(self.client.server_info().limits.regions_enabled)
        shm = self.shm(4096)
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, shm.register, self.client, "x")
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, self.client.region_status)
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, self.client.unregister_regions)
        header = pb.JobHeader(rows=2, cols=2, dtype=pb.DTYPE_FLOAT64,
                              diagonal=np.ones(2).tobytes())
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, self.client.multiply_region_refs,
                        header, pb.RegionRef(name="x"), pb.RegionRef(name="x"))


def _have_cupy_gpu():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "skip".
        return False


@unittest.skipUnless(_have_cupy_gpu(), "needs CuPy and a GPU (tests/gpu/regions_gpu_test.py "
                     "runs IPC against a GPU server)")
class CudaIpcClientTest(RegionTestCase):
    def test_a_cupy_array_registers_with_its_allocation_base_and_offset(self):
        import cupy
        pool = cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(pool.malloc):
            a = cupy.ones((64, 64), dtype=cupy.float32)
            view = a[8:]  # Not the allocation's base.
        region = dgmm.CudaIpcRegion(view)
        self.assertEqual(len(region.handle), 64)
        self.assertEqual(region.offset - dgmm.CudaIpcRegion(a).offset, 8 * 64 * 4)
        self.assertEqual(region.byte_size, 56 * 64 * 4)
        # A CPU server has no GPU to open it on.
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, region.register, self.client, "g")


if __name__ == "__main__":
    unittest.main()
