"""dgmm.regions (client/python/dgmm/regions.py) against the real CPU server
with --allow_regions: jobs on NumPy views of shared memory (memfds, sealed
or not, and POSIX objects), passed to the server by file descriptor over the
client's local-socket session, checked against a float64
reference on fresh random data with outputs poisoned (NaN) before each job;
in place; the diagonal in a region; sessions (none: UNAUTHENTICATED; closed
with their client or process: regions dropped; another server's socket:
refused; several Clients of one uid: shared regions; another uid: none);
bad inputs with their status codes; and registered and reserved bytes back
to 0 after every path.

Run by ctest (test `python_regions`), or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server \\
    build/python-venv/bin/python tests/python/test_regions.py -v
Exits 77 (ctest's skip code) when this interpreter lacks grpcio/numpy. The
CUDA IPC part needs a GPU server: tests/gpu/regions_gpu_test.py.
"""

import errno
import fcntl
import os
import signal
import shutil
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
                    "--max_regions_per_client=6", "--max_region_share_percent=100")


def tearDownModule():
    if SERVER:
        SERVER.stop()


def wait_until(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def raw(call, *args, **kwargs):
    """A grpcio stub call with its RpcError as a DgmmError."""
    try:
        return call(*args, **kwargs)
    except grpc.RpcError as e:
        raise dgmm.DgmmError.from_rpc_error(e) from None


class RegionTestCase(unittest.TestCase):
    server = None  # None: the module's SERVER

    def setUp(self):
        self.client = dgmm.Client((self.server or SERVER).address)
        self._channel = None
        self.rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        self.regions = []
        self.clients = []

    @property
    def stub(self):
        """A grpcio stub of the server's Dgmm service: an independent client
        for raw region calls, with the metadata each test gives."""
        if self._channel is None:
            self._channel = grpc.insecure_channel((self.server or SERVER).address)
        return dgmm.pb_grpc.DgmmStub(self._channel)

    def tearDown(self):
        if self._channel is not None:
            self._channel.close()
        for region in self.regions:
            region.close()
        for client in self.clients:
            client.close()
        try:
            # Regions of sessions closed just now go when the server sees the close.
            wait_until(lambda: self.client.region_status().registered_bytes == 0, 5)
            status = self.client.region_status()
            info = self.client.server_info()
        finally:
            self.client.close()
        # Every path leaves nothing registered and nothing reserved.
        self.assertEqual(list(status.regions), [])
        self.assertEqual(status.registered_bytes, 0)
        for device in info.devices:
            self.assertEqual(device.reserved_bytes, 0, device)

    def shm(self, byte_size, name=None, client=None, **kwargs):
        region = dgmm.SharedMemoryRegion(byte_size, **kwargs)
        self.regions.append(region)
        if name:
            region.register(client or self.client, name)
        return region

    def other_client(self, **kwargs):
        client = dgmm.Client((self.server or SERVER).address, **kwargs)
        self.clients.append(client)
        return client

    def random(self, shape, dtype):
        return self.rng.uniform(-4, 4, shape).astype(dtype)

    def assertCode(self, code, call, *args, **kwargs):
        with self.assertRaises(dgmm.DgmmError) as raised:
            call(*args, **kwargs)
        self.assertEqual(raised.exception.code, code, raised.exception.details)
        self.assertTrue(raised.exception.details)
        return raised.exception

    def check_job(self, shm, client=None, rows=48, cols=40, dtype=np.float64, offset=0):
        """A fresh job A -> C in `shm` (A at `offset`, C right after it), checked."""
        a = shm.ndarray((rows, cols), dtype, offset=offset)
        c = shm.ndarray((rows, cols), dtype, offset=offset + a.nbytes)
        a[:] = self.random((rows, cols), dtype)
        c[:] = np.nan
        d = self.random(cols, dtype)
        (client or self.client).multiply_region(a, d, out=c)
        np.testing.assert_allclose(c, reference(a, d, "right"), rtol=tolerance(dtype), atol=0)

    # Raw calls: a ticket for a descriptor, and RegisterRegion with it.
    def session(self, client=None):
        return (client or self.client).local_session()

    def register_raw(self, name, fd, offset=0, byte_size=4096, session=None, metadata=None):
        session = session or self.session()
        ticket = session.pass_fd(fd)
        request = pb.RegisterRegionRequest(name=name, local_fd=pb.LocalFdRegion(
            ticket=ticket.ticket, offset=offset, byte_size=byte_size))
        return raw(self.stub.RegisterRegion, request,
                   metadata=session.metadata() if metadata is None else metadata)


class RegionJobTest(RegionTestCase):
    def test_server_says_regions_are_on_with_the_limits_it_was_given(self):
        info = self.client.server_info()
        limits = info.limits
        self.assertTrue(limits.regions_enabled)
        self.assertEqual(limits.region_budget_bytes, 64 * MIB)
        self.assertEqual(limits.max_regions_per_client, 6)
        self.assertTrue(limits.local_socket.startswith("/"), limits.local_socket)
        self.assertTrue(info.instance_id)

    def test_round_trips_for_every_dtype_layout_and_side(self):
        rows, cols = 67, 41
        shm = self.shm(2 * rows * cols * 8 + 4096, "jobs")
        self.assertTrue(shm.sealed)
        self.assertIsNone(shm.key)
        status = self.client.region_status("jobs")
        self.assertEqual(len(status.regions), 1)
        region = status.regions[0]
        self.assertEqual((region.kind, region.byte_size, region.device, region.sealed,
                          region.owner_uid),
                         (pb.REGION_KIND_SYSTEM_SHM, shm.byte_size, -1, True, os.getuid()))
        self.assertTrue(region.key.startswith("/memfd:dgmm-py-"), region.key)
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
        shm = self.shm(2 * 48 * 40 * 8, "again")
        self.assertTrue(shm.unregister())
        self.assertFalse(shm.registered)
        shm.register(self.client, "again")  # The descriptor is passed again: a new ticket.
        self.check_job(shm)
        self.assertEqual(self.client.unregister_regions(), 1)
        self.assertFalse(shm.registered)
        self.assertFalse(shm.unregister())

    def test_a_posix_object_made_by_key_is_passed_by_descriptor(self):
        key = "/dgmm-py-test-%d-%s" % (os.getpid(), os.urandom(4).hex())
        shm = self.shm(2 * 48 * 40 * 8, "by-key", key=key)
        self.assertEqual((shm.key, shm.path), (key, "/dev/shm" + key))
        self.assertFalse(shm.sealed)  # A POSIX object cannot be sealed.
        status = self.client.region_status("by-key").regions[0]
        self.assertEqual((status.key, status.sealed), ("/dev/shm" + key, False))
        self.check_job(shm)
        shm.close()
        self.assertFalse(os.path.exists("/dev/shm" + key))  # close() unlinks what it made.

    def test_an_existing_object_of_the_caller_and_a_callers_descriptor(self):
        key = "/dgmm-py-caller-%d-%s" % (os.getpid(), os.urandom(4).hex())
        fd = os.open("/dev/shm" + key, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, 2 * 48 * 40 * 8)
            opened = dgmm.SharedMemoryRegion.open(key)
            self.regions.append(opened)
            self.assertEqual((opened.key, opened.byte_size), (key, 2 * 48 * 40 * 8))
            opened.register(self.client, "opened")
            self.check_job(opened)
            # The caller's own view of the object sees the server's result.
            mine = np.frombuffer(os.pread(fd, 48 * 40 * 8, 48 * 40 * 8), np.float64)
            np.testing.assert_array_equal(mine, opened.ndarray((48 * 40,), offset=48 * 40 * 8))
            opened.close()
            self.assertTrue(os.path.exists("/dev/shm" + key))  # The caller's: left alone.
            dup = dgmm.SharedMemoryRegion.from_fd(fd)
            self.regions.append(dup)
            self.assertNotEqual(dup.fd, fd)
            dup.register(self.client, "from-fd")
            self.check_job(dup)
            dup.close()
            os.fstat(fd)  # Still the caller's, open.
        finally:
            os.close(fd)
            os.unlink("/dev/shm" + key)

    def test_jobs_from_several_threads_share_the_session(self):
        errors = []

        def worker(i):
            try:
                shm = dgmm.SharedMemoryRegion(2 * 64 * 50 * 8)
                self.regions.append(shm)
                shm.register(self.client, "thread-%d" % i)
                for _ in range(5):
                    self.check_job(shm, rows=64, cols=50)
                self.assertTrue(shm.unregister())
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])


class SealTest(RegionTestCase):
    def test_a_sealed_memfd_cannot_change_size_and_jobs_stay_right(self):
        shm = self.shm(2 * 48 * 40 * 8, "sealed")
        self.assertTrue(self.client.region_status("sealed").regions[0].sealed)
        self.check_job(shm)
        for size in (0, shm.byte_size // 2, shm.byte_size * 2):
            with self.subTest(size=size):
                with self.assertRaises(PermissionError) as raised:
                    os.ftruncate(shm.fd, size)
                self.assertEqual(raised.exception.errno, errno.EPERM)
        # The seals themselves are sealed: none can be removed or added.
        with self.assertRaises(PermissionError):
            fcntl.fcntl(shm.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        self.assertEqual(os.fstat(shm.fd).st_size, shm.byte_size)
        self.check_job(shm)  # Still right after the attempts.

    def test_an_unsealed_memfd_registers_unsealed(self):
        shm = self.shm(2 * 48 * 40 * 8, "unsealed", seal=False)
        self.assertFalse(shm.sealed)
        self.assertFalse(self.client.region_status("unsealed").regions[0].sealed)
        self.check_job(shm)


class SessionTest(RegionTestCase):
    def test_the_session_names_this_process_and_this_server(self):
        info = self.client.server_info()
        session = self.client.local_session()
        self.assertIs(self.client.local_session(), session)  # One per Client, kept.
        self.assertEqual((session.uid, session.gid, session.pid),
                         (os.getuid(), os.getgid(), os.getpid()))
        self.assertEqual(session.instance_id, info.instance_id)
        self.assertEqual(session.path, info.limits.local_socket)
        self.assertEqual(len(session.session), 64)
        self.assertGreater(session.max_tickets, 0)
        self.assertGreater(session.ticket_timeout_ms, 0)
        # Another Client: another session.
        self.assertNotEqual(self.other_client().local_session().session, session.session)

    def test_region_calls_without_a_session_are_unauthenticated(self):
        shm = self.shm(2 * 48 * 40 * 8)
        session = self.session()
        ticket = session.pass_fd(shm.fd)
        request = pb.RegisterRegionRequest(name="nosession", local_fd=pb.LocalFdRegion(
            ticket=ticket.ticket, offset=0, byte_size=shm.byte_size))
        stub = self.stub
        for metadata in (None, (("dgmm-session", "00" * 32),), (("dgmm-session", ""),)):
            with self.subTest(metadata=metadata):
                error = self.assertCode(grpc.StatusCode.UNAUTHENTICATED, raw,
                                        stub.RegisterRegion, request, metadata=metadata)
                self.assertIn("dgmm-session", error.details)
                self.assertCode(grpc.StatusCode.UNAUTHENTICATED, raw, stub.GetRegionStatus,
                                pb.GetRegionStatusRequest(), metadata=metadata)
                self.assertCode(grpc.StatusCode.UNAUTHENTICATED, raw, stub.UnregisterRegion,
                                pb.UnregisterRegionRequest(), metadata=metadata)
                header = pb.JobHeader(rows=2, cols=2, dtype=pb.DTYPE_FLOAT64,
                                      diagonal=np.ones(2).tobytes())
                self.assertCode(grpc.StatusCode.UNAUTHENTICATED, raw, stub.MultiplyRegion,
                                pb.MultiplyRegionRequest(header=header,
                                                         matrix=pb.RegionRef(name="x"),
                                                         result=pb.RegionRef(name="x")),
                                metadata=metadata)
        # Nothing was registered, and the refused calls left the ticket unused.
        self.assertEqual(list(self.client.region_status().regions), [])
        raw(stub.RegisterRegion, request, metadata=session.metadata())
        self.assertEqual([r.name for r in self.client.region_status().regions], ["nosession"])
        self.assertEqual(raw(stub.UnregisterRegion, pb.UnregisterRegionRequest(name="nosession"),
                             metadata=session.metadata()).unregistered, 1)

    def test_a_ticket_is_used_once_and_by_its_own_session_only(self):
        shm = self.shm(4096)
        mine, other = self.session(), self.session(self.other_client())
        ticket = mine.pass_fd(shm.fd)
        request = pb.RegisterRegionRequest(name="ticket", local_fd=pb.LocalFdRegion(
            ticket=ticket.ticket, offset=0, byte_size=4096))
        stub = self.stub
        self.assertCode(grpc.StatusCode.NOT_FOUND, raw, stub.RegisterRegion, request,
                        metadata=other.metadata())
        raw(stub.RegisterRegion, request, metadata=mine.metadata())
        self.assertCode(grpc.StatusCode.NOT_FOUND, raw, stub.RegisterRegion, request,
                        metadata=mine.metadata())
        raw(stub.UnregisterRegion, pb.UnregisterRegionRequest(name="ticket"),
            metadata=mine.metadata())

    def test_system_shm_by_key_is_invalid_argument(self):
        key = "/dgmm-py-byname-%d" % os.getpid()
        shm = self.shm(4096, key=key)
        request = pb.RegisterRegionRequest(name="byname", system_shm=pb.SystemShmRegion(
            key=shm.key, offset=0, byte_size=4096))
        error = self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, raw,
                                self.stub.RegisterRegion, request,
                                metadata=self.session().metadata())
        self.assertIn("local socket", error.details)

    def test_a_region_is_dropped_when_its_client_closes(self):
        other = self.other_client()
        shm = self.shm(2 * 48 * 40 * 8, "closing", client=other)
        self.check_job(shm, client=other)
        self.assertEqual([r.name for r in self.client.region_status().regions], ["closing"])
        other.close()
        self.assertFalse(shm.registered)
        # The listing drops the region first; its bytes go back when the
        # server lets go of its mapping, a moment later.
        self.assertTrue(wait_until(lambda: not self.client.region_status().regions, 5),
                        "the region of a closed Client is still registered after 5 s")
        wait_until(lambda: self.client.region_status().registered_bytes == 0, 5)
        self.assertEqual(self.client.region_status().registered_bytes, 0)
        self.assertFalse(shm.unregister())  # Nothing left to unregister.
        # The memory is still this process's: it registers again with another Client.
        shm.register(self.client, "closing")
        self.check_job(shm)

    def test_clients_of_one_uid_share_their_regions(self):
        # Regions belong to the uid (no tokens here), not to the Client or
        # the session: another Client of this uid sees them, runs jobs on
        # them by name and may unregister them.
        first, second = self.other_client(), self.other_client()
        rows, cols = 48, 40
        shm = self.shm(2 * rows * cols * 8, "shared", client=first)
        status = second.region_status("shared").regions[0]
        self.assertEqual(status.owner_uid, os.getuid())
        a = shm.ndarray((rows, cols), np.float64)
        c = shm.ndarray((rows, cols), np.float64, offset=a.nbytes)
        a[:] = self.random((rows, cols), np.float64)
        c[:] = np.nan
        d = self.random(cols, np.float64)
        header = pb.JobHeader(rows=rows, cols=cols, dtype=pb.DTYPE_FLOAT64,
                              diagonal=d.tobytes())
        second.multiply_region_refs(header, pb.RegionRef(name="shared"),
                                    pb.RegionRef(name="shared", offset=a.nbytes))
        np.testing.assert_allclose(c, reference(a, d, "right"), rtol=1e-15, atol=0)
        # One namespace: the name is taken for every Client of the uid.
        again = self.shm(4096)
        self.assertCode(grpc.StatusCode.ALREADY_EXISTS, again.register, second, "shared")
        # The array API looks only at the Client's own registrations.
        with self.assertRaisesRegex(ValueError, "not in a region registered"):
            second.multiply_region(a, d, out=c)
        # unregister_regions() unregisters only this Client's own regions ...
        self.assertEqual(second.unregister_regions(), 0)
        self.assertEqual(len(first.region_status().regions), 1)
        # ... but a name is the uid's: the other Client may unregister it.
        self.assertEqual(raw(self.stub.UnregisterRegion,
                             pb.UnregisterRegionRequest(name="shared"),
                             metadata=second.local_session().metadata()).unregistered, 1)
        self.assertEqual(list(first.region_status().regions), [])
        self.assertFalse(shm.unregister())

    def test_unregister_regions_of_the_whole_owner(self):
        first, second = self.other_client(), self.other_client()
        self.shm(4096, "one", client=first)
        self.shm(4096, "two", client=second)
        self.assertEqual(second.unregister_regions(all_of_owner=True), 2)
        self.assertEqual(list(first.region_status().regions), [])

    def test_another_uid_sees_none_of_them(self):
        if os.getuid() != 0:
            self.skipTest("needs root, to run a client as another uid")
        shm = self.shm(2 * 48 * 40 * 8, "roots")
        # The child drops to uid 65534, which may not read this checkout or
        # its build (a clone in a private folder): it imports a copy of the
        # installed package, made where every uid can read it.
        shared = tempfile.mkdtemp(prefix="dgmm-other-uid-", dir="/tmp")
        self.addCleanup(shutil.rmtree, shared, True)
        os.chmod(shared, 0o755)
        shutil.copytree(os.path.dirname(dgmm.__file__), os.path.join(shared, "dgmm"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for folder, dirs, files in os.walk(shared):
            for name in dirs:
                os.chmod(os.path.join(folder, name), 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        child = subprocess.run([sys.executable, "-c", (
            "import os, sys\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "sys.path.insert(0, sys.argv[2])\n"
            "sys.dont_write_bytecode = True\n"
            "import dgmm, grpc, numpy as np\n"
            "assert dgmm.__file__.startswith(sys.argv[2]), dgmm.__file__\n"
            "from dgmm import pb\n"
            "client = dgmm.Client(sys.argv[1])\n"
            "s = client.local_session()\n"
            "print('uid', s.uid)\n"
            "print('regions', len(client.region_status().regions))\n"
            "h = pb.JobHeader(rows=2, cols=2, dtype=pb.DTYPE_FLOAT64,"
            " diagonal=np.ones(2).tobytes())\n"
            "try:\n"
            "    client.multiply_region_refs(h, pb.RegionRef(name='roots'),"
            " pb.RegionRef(name='roots'))\n"
            "except dgmm.DgmmError as e:\n"
            "    print('job', e.code.name)\n"
            "mine = dgmm.SharedMemoryRegion(4096).register(client, 'roots')\n"
            "print('own', mine.status.owner_uid)\n"), SERVER.address, shared],
            capture_output=True, text=True, timeout=60, cwd="/")
        if child.returncode != 0 and "Permission denied" in child.stderr:
            self.skipTest("uid 65534 cannot read the client package: %s" % child.stderr[-300:])
        self.assertEqual(child.returncode, 0, child.stderr)
        self.assertEqual(child.stdout.split("\n")[:4],
                         ["uid 65534", "regions 0", "job NOT_FOUND", "own 65534"])
        self.check_job(shm)  # Ours is untouched.

    def test_the_socket_path_can_be_overridden(self):
        path = self.client.server_info().limits.local_socket
        with tempfile.TemporaryDirectory() as tmp:
            link = os.path.join(tmp, "elsewhere.sock")
            os.symlink(path, link)  # As a container that mounts the directory elsewhere.
            by_argument = self.other_client(local_socket=link)
            self.assertEqual(by_argument.local_session().path, link)
            self.check_job(self.shm(2 * 48 * 40 * 8, "by-argument", client=by_argument),
                           client=by_argument)
            os.environ["DGMM_LOCAL_SOCKET"] = link
            try:
                by_env = self.other_client()
                self.assertEqual(by_env.local_session().path, link)
            finally:
                del os.environ["DGMM_LOCAL_SOCKET"]

    def test_a_socket_that_cannot_be_reached_says_regions_need_the_servers_host(self):
        client = self.other_client(local_socket="/nonexistent-dir/dgmm.sock")
        shm = self.shm(4096)
        for call, args in ((shm.register, (client, "x")), (client.region_status, ()),
                           (client.local_session, ())):
            with self.subTest(call=call.__name__):
                error = self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, call, *args)
                self.assertIn("/nonexistent-dir/dgmm.sock", error.details)
                self.assertIn("server's host", error.details)
        self.assertFalse(shm.registered)
        # Not a socket at all.
        with tempfile.NamedTemporaryFile() as f:
            client = self.other_client(local_socket=f.name)
            self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, client.region_status)

    def test_the_socket_of_another_server_is_refused(self):
        other_server = Server("--allow_regions")
        try:
            with dgmm.Client(other_server.address) as probe:
                other_path = probe.server_info().limits.local_socket
            client = self.other_client(local_socket=other_path)
            error = self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, client.region_status)
            self.assertIn("another dgmm server", error.details)
        finally:
            other_server.stop()

    def test_a_restarted_server_gets_a_new_session_and_the_old_regions_are_forgotten(self):
        server = Server("--allow_regions")
        port = server.port
        client = dgmm.Client(server.address)
        try:
            shm = self.shm(2 * 48 * 40 * 8, "before", client=client)
            a = shm.ndarray((48, 40), np.float64)
            c = shm.ndarray((48, 40), np.float64, offset=a.nbytes)
            first = client.local_session()
            server.stop()
            # The same port again (absl: the last --listen wins).
            server = Server("--allow_regions", "--listen=127.0.0.1:%d" % port)
            self.assertEqual(server.port, port)
            self.assertTrue(wait_until(lambda: not first.alive(), 5))
            self.assertEqual(list(client.region_status().regions), [])
            self.assertIsNot(client.local_session(), first)
            self.assertFalse(shm.registered)
            with self.assertRaisesRegex(ValueError, "dropped its regions before: register"):
                client.multiply_region(a, np.ones(40), out=c)
            shm.register(client, "before")
            self.check_job(shm, client=client)
            shm.close()
        finally:
            client.close()
            server.stop()


class BadInputTest(RegionTestCase):
    def test_names_and_keys_are_validated(self):
        shm = self.shm(4096)
        for name in ("", "a/b", "../x", "x" * 65, "sp ace"):
            with self.subTest(name=name):
                self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.register_raw,
                                name, shm.fd)
        session = self.session()
        for key in ("/", "/.", "/..", "/a/b", "dev/shm/x", "/dev/shm/x", "/" + "k" * 201):
            with self.subTest(key=key):
                self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, session.open_shm, key)
        # The client refuses them before sending.
        with self.assertRaisesRegex(ValueError, "region name"):
            shm.register(self.client, "a/b")
        with self.assertRaisesRegex(ValueError, "shared-memory key"):
            dgmm.SharedMemoryRegion(64, key="/../etc")
        with self.assertRaisesRegex(ValueError, "shared-memory key"):
            dgmm.SharedMemoryRegion.open("/a/b")

    def test_ranges_are_checked_against_the_objects_real_size(self):
        shm = self.shm(4096)
        for offset, size in ((0, 4097), (4000, 97), (-1, 10), (0, 0), (0, -5)):
            with self.subTest(offset=offset, size=size):
                self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, self.register_raw,
                                "r", shm.fd, offset, size)
                # The client checks them itself, before passing the descriptor.
                with self.assertRaises(dgmm.InvalidArgumentError):
                    shm.register(self.client, "r", offset=offset, byte_size=size)
        self.register_raw("r", shm.fd, 96, 4000)  # Exactly to the end: fine.
        self.assertEqual(self.client.region_status("r").regions[0].offset, 96)
        self.client.unregister_regions(all_of_owner=True)

    def test_descriptors_that_are_not_memory_are_refused(self):
        session = self.session()
        read_end, write_end = os.pipe()
        try:
            error = self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, session.pass_fd, read_end)
            self.assertIn("pipe", error.details)
        finally:
            os.close(read_end)
            os.close(write_end)
        with tempfile.NamedTemporaryFile(dir=REPO) as f:  # A file on disk.
            f.truncate(4096)
            fd = os.open(f.name, os.O_RDWR)
            try:
                self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, session.pass_fd, fd)
            finally:
                os.close(fd)
        # Memory opened read-only: the server writes results.
        shm = self.shm(4096)
        fd = os.open("/proc/self/fd/%d" % shm.fd, os.O_RDONLY)
        try:
            error = self.assertCode(grpc.StatusCode.INVALID_ARGUMENT, session.pass_fd, fd)
            self.assertIn("reading and writing", error.details)
        finally:
            os.close(fd)
        self.assertTrue(session.alive())  # Refusals do not end the session.
        session.pass_fd(shm.fd)

    def test_open_shm_opens_only_an_object_of_this_uid_that_no_one_else_may_write(self):
        session = self.session()
        key = "/dgmm-py-open-%d-%s" % (os.getpid(), os.urandom(4).hex())
        path = "/dev/shm" + key
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, 8192)
            ticket = session.open_shm(key)
            self.assertEqual((ticket.object_bytes, ticket.sealed), (8192, False))
            raw(self.stub.RegisterRegion, pb.RegisterRegionRequest(
                name="opened", local_fd=pb.LocalFdRegion(ticket=ticket.ticket, offset=0,
                                                         byte_size=8192)),
                metadata=session.metadata())
            self.assertEqual(self.client.region_status("opened").regions[0].key, path)
            os.fchmod(fd, 0o620)  # Group-writable: refused.
            self.assertCode(grpc.StatusCode.PERMISSION_DENIED, session.open_shm, key)
        finally:
            os.close(fd)
            os.unlink(path)
        self.assertCode(grpc.StatusCode.NOT_FOUND, session.open_shm, key)
        self.client.unregister_regions(all_of_owner=True)

    def test_unclaimed_tickets_are_bounded_per_session(self):
        session = self.session()
        shm = self.shm(4096)
        for _ in range(session.max_tickets):
            session.pass_fd(shm.fd)
        self.assertCode(grpc.StatusCode.RESOURCE_EXHAUSTED, session.pass_fd, shm.fd)
        self.assertTrue(session.alive())

    def test_an_object_that_does_not_exist(self):
        with self.assertRaises(FileNotFoundError):
            dgmm.SharedMemoryRegion.open("/dgmm-py-no-such-object-%d" % os.getpid())
        key = "/dgmm-py-exists-%d" % os.getpid()
        self.shm(64, key=key)
        with self.assertRaises(FileExistsError):
            dgmm.SharedMemoryRegion(64, key=key)  # A new object must be new.

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
        # With tokens on, a region belongs to the uid and the token that registered it.
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
            before = a.copy()
            d = self.random(8, np.float64)
            small = pb.JobHeader(rows=8, cols=8, dtype=pb.DTYPE_FLOAT64, diagonal=d.tobytes())
            self.assertCode(grpc.StatusCode.NOT_FOUND, other.multiply_region_refs,
                            small, shm.ref(0), shm.ref(0))
            np.testing.assert_array_equal(a, before)
            self.assertCode(grpc.StatusCode.NOT_FOUND, other.region_status, "mine")
            self.assertEqual(list(other.region_status().regions), [])
            self.assertEqual(other.unregister_regions(all_of_owner=True), 0)
            self.assertEqual([r.name for r in mine.region_status().regions], ["mine"])
            # The owner's job runs; the same name is free for the other token.
            mine.multiply_region_refs(small, shm.ref(0), shm.ref(0))
            np.testing.assert_allclose(a, reference(before, d, "right"), rtol=1e-15, atol=0)
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
        with self.assertRaisesRegex(ValueError, "float32, float64"):
            self.client.multiply_region(shm.ndarray((10, 10), np.int64), np.ones(10),
                                        out=shm.ndarray((10, 10), np.int64))

    def test_cuda_ipc_on_a_cpu_server_is_failed_precondition(self):
        request = pb.RegisterRegionRequest(name="gpu", cuda_ipc=pb.CudaIpcRegion(
            handle=os.urandom(64), device=0, offset=0, byte_size=4096))
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, raw,
                        self.stub.RegisterRegion, request,
                        metadata=self.session().metadata())


class ShmLifecycleTest(RegionTestCase):
    def test_an_unlinked_object_stays_registered_while_its_session_lives(self):
        # The server holds the descriptor, not the name: unlinking the object
        # takes nothing from the region.
        key = "/dgmm-py-unlinked-%d" % os.getpid()
        shm = self.shm(2 * 48 * 40 * 8, "unlinked", key=key)
        os.unlink(shm.path)
        time.sleep(0.3)
        self.assertEqual([r.name for r in self.client.region_status().regions], ["unlinked"])
        self.check_job(shm)

    def test_a_client_process_killed_with_its_regions_registered_leaks_nothing(self):
        child = subprocess.Popen([sys.executable, "-c", (
            "import sys, time, dgmm\n"
            "client = dgmm.Client(sys.argv[1])\n"
            "shm = dgmm.SharedMemoryRegion(1 << 20).register(client, 'child')\n"
            "print(client.region_status().registered_bytes, flush=True)\n"
            "time.sleep(60)\n"), SERVER.address], stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(child.stdout.readline().split(), [str(MIB)])
            status = self.client.region_status()  # The same uid: the child's region shows.
            self.assertEqual([(r.name, r.owner_uid) for r in status.regions],
                             [("child", os.getuid())])
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            child.stdout.close()
        # The kernel closes its local socket connection: the session ends and
        # the server drops its regions (and unmaps the memfd, the last user).
        self.assertTrue(wait_until(
            lambda: self.client.region_status().registered_bytes == 0, 5),
            "a killed client's region is still registered after 5 s")
        self.assertEqual(list(self.client.region_status().regions), [])

    def test_a_shrunk_object_fails_the_job_and_the_server_lives(self):
        key = "/dgmm-py-shrink-%d" % os.getpid()
        for what in ("posix object", "unsealed memfd"):
            with self.subTest(what=what):
                shm = self.shm(64 * 64 * 8, "shrink",
                               **({"key": key} if what == "posix object" else {"seal": False}))
                a = shm.ndarray((64, 64), np.float64)
                a[:] = 1
                del a
                os.ftruncate(shm.fd, 0)  # Unsealed: allowed.
                header = pb.JobHeader(rows=64, cols=64, dtype=pb.DTYPE_FLOAT64,
                                      diagonal=np.ones(64).tobytes())
                self.assertCode(grpc.StatusCode.FAILED_PRECONDITION,
                                self.client.multiply_region_refs, header, shm.ref(0), shm.ref(0))
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

    @property
    def stub(self):
        """A grpcio stub of the server's Dgmm service: an independent client
        for raw region calls, with the metadata each test gives."""
        if self._channel is None:
            self._channel = grpc.insecure_channel((self.server or SERVER).address)
        return dgmm.pb_grpc.DgmmStub(self._channel)

    def tearDown(self):
        if self._channel is not None:
            self._channel.close()
        for region in self.regions:
            region.close()
        self.client.close()

    def test_every_region_rpc_is_failed_precondition(self):
        limits = self.client.server_info().limits
        self.assertFalse(limits.regions_enabled)
        self.assertEqual(limits.local_socket, "")
        shm = self.shm(4096)
        # The client says so before any session (there is no socket to reach).
        for call, args in ((shm.register, (self.client, "x")), (self.client.region_status, ()),
                           (self.client.unregister_regions, ()),
                           (self.client.multiply_region_refs,
                            (pb.JobHeader(rows=2, cols=2, dtype=pb.DTYPE_FLOAT64,
                                          diagonal=np.ones(2).tobytes()),
                             pb.RegionRef(name="x"), pb.RegionRef(name="x")))):
            with self.subTest(call=call.__name__):
                error = self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, call, *args)
                self.assertIn("--allow_regions", error.details)
        # And so does the server, before it looks for a session.
        stub = self.stub
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, raw, stub.GetRegionStatus,
                        pb.GetRegionStatusRequest())
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, raw, stub.MultiplyRegion,
                        pb.MultiplyRegionRequest(
                            header=pb.JobHeader(rows=2, cols=2, dtype=pb.DTYPE_FLOAT64,
                                                diagonal=np.ones(2).tobytes()),
                            matrix=pb.RegionRef(name="x"), result=pb.RegionRef(name="x")))


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
