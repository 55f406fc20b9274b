"""The same-host path of dgmm.Client.multiply against the real CPU
server: by default a matrix of 1 MiB and more goes through a staging region
of the C++ client (a sealed memfd registered through the local socket,
reused, grown by powers of two) when the server is on this host with
--allow_regions, else over the socket with info.socket_reason; and the
zero-copy arrays dgmm.empty / zeros / asarray, on which multiply runs a
MultiplyRegion in place or into another such array.

Every job: fresh random data, the output poisoned with NaN first, checked
element by element against a float64 NumPy reference. Every test ends with
nothing registered and nothing reserved on the server.

Run by ctest (test `python_same_host`), or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server \\
    build/python-venv/bin/python tests/python/test_same_host.py -v
Exits 77 (ctest's skip code) when this interpreter lacks grpcio/numpy.
"""

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
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
from dgmm_server import (ServerProcess, completed_jobs, reference, running_jobs,  # noqa: E402
                         tolerance)
import dgmm  # noqa: E402
import dgmm.aio  # noqa: E402
from dgmm import pb  # noqa: E402

MIB = 1 << 20
STAGING_PREFIX = "dgmm-staging-"
# Shapes of about 1.1 MiB (float32) and 2.1 MiB (float64): over the 1 MiB
# threshold, rows != cols, neither a multiple of anything.
ROWS, COLS = 523, 541


def staging_size(nbytes):
    """The C++ client's staging region size: the power of two >= 1 MiB that holds nbytes."""
    size = MIB
    while size < nbytes:
        size *= 2
    return size


class Server(ServerProcess):
    """dgmm-server (CPU backend, 2 threads) on an ephemeral loopback port."""

    def __init__(self, *flags):
        super().__init__(flags=("--threads=2", *flags), prefix="dgmm-py-same-host-")


SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server("--allow_regions", "--region_memory_budget=512MiB",
                    "--max_region_share_percent=100")


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


class SameHostTestCase(unittest.TestCase):
    server = None  # None: the module's SERVER
    # The clients of these tests use the staging region (process memory
    # off) unless a test case says otherwise: ProcessMemoryTest.
    process_memory = False

    @property
    def address(self):
        return (self.server or SERVER).address

    def setUp(self):
        self.rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        self.clients = []
        self.client = self.new_client()
        # Sees every region of this uid on the server (the test's clients'
        # staging regions and arrays, and other processes' of this uid).
        self.observer = dgmm.Client(self.address)

    def tearDown(self):
        for client in self.clients:
            client.close()
        try:
            if (self.server or SERVER).process.poll() is None:
                self.assertNothingHeld()
        finally:
            self.observer.close()

    def assertNothingHeld(self):
        # Regions of sessions closed just now go when the server sees the close.
        if (self.server or SERVER).process.poll() is not None:
            return
        if not self.observer.server_info().limits.regions_enabled:
            return
        wait_until(lambda: (self.observer.region_status().registered_bytes == 0 and
                            all(d.reserved_bytes == 0
                                for d in self.observer.server_info().devices)), 5)
        status = self.observer.region_status()
        self.assertEqual([r.name for r in status.regions], [])
        self.assertEqual(status.registered_bytes, 0)
        for device in self.observer.server_info().devices:
            self.assertEqual(device.reserved_bytes, 0, device)

    def new_client(self, **kwargs):
        kwargs.setdefault("process_memory", self.process_memory)
        client = dgmm.Client(self.address, **kwargs)
        self.clients.append(client)
        return client

    def random(self, shape, dtype, order="C"):
        return np.asarray(self.rng.uniform(-4, 4, shape).astype(dtype), order=order)

    def check(self, c, a, d, side):
        """C against the float64 reference, element by element (no NaN left)."""
        self.assertFalse(np.isnan(c).any(), "NaN left in C: elements not written")
        np.testing.assert_allclose(c, reference(a, d, side), rtol=tolerance(c.dtype), atol=0)

    def job(self, client, dtype=np.float64, order="C", side="right", rows=ROWS, cols=COLS,
            use_out=True, **kwargs):
        """A fresh checked job through client.multiply; its MultiplyInfo."""
        a = self.random((rows, cols), dtype, order)
        before = a.copy(order="A")
        d = self.random(cols if side == "right" else rows, dtype)
        out = np.full((rows, cols), np.nan, dtype=dtype, order=order) if use_out else None
        c, info = client.multiply(a, d, side=side, out=out, return_info=True, **kwargs)
        if use_out:
            self.assertIs(c, out)
        self.assertEqual(c.dtype, np.dtype(dtype))
        self.assertTrue(c.flags[order + "_CONTIGUOUS"])
        self.check(c, before, d, side)
        np.testing.assert_array_equal(a, before)  # A is left alone
        return info

    def kill_child_mid_job(self, script, ready, busy, never_busy):
        """Runs `script` (argv[1]: the server's address) in a child process,
        which prints `ready` and then loops over jobs; once busy(child) holds
        (within 30 s, else fails with `never_busy`) it is killed with
        SIGKILL."""
        child = subprocess.Popen([sys.executable, "-c", script, self.address],
                                 stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(child.stdout.readline(), ready)
            self.assertTrue(wait_until(lambda: busy(child), 30), never_busy)
            child.send_signal(signal.SIGKILL)
            child.wait(10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
        self.assertEqual(child.returncode, -signal.SIGKILL)

    def staging(self, pid=None):
        """{name: RegionStatus} of the staging regions of process `pid` (this one)."""
        prefix = "%s%d-" % (STAGING_PREFIX, os.getpid() if pid is None else pid)
        return {r.name: r for r in self.observer.region_status().regions
                if r.name.startswith(prefix)}


class SameHostPathTest(SameHostTestCase):
    def test_every_dtype_layout_and_side_goes_through_shared_memory(self):
        for dtype in (np.float32, np.float64):
            for order in "CF":
                for side in ("right", "left"):
                    with self.subTest(dtype=dtype.__name__, order=order, side=side):
                        self.assertGreaterEqual(ROWS * COLS * np.dtype(dtype).itemsize, MIB)
                        info = self.job(self.client, dtype, order, side)
                        self.assertEqual((info.mode, info.socket_reason, info.stripes),
                                         ("shm", "", 1))
                        self.assertEqual(len(info.stats), 1)
                        self.assertEqual(info.stats[0].backend, pb.BACKEND_CPU)
                        # The phases as the client saw them.
                        self.assertEqual(sorted(info.same_host),
                                         ["copy_in", "copy_out", "job", "setup"])
                        self.assertGreater(info.same_host["copy_in"], 0)
                        self.assertGreater(info.same_host["job"], 0)
                        self.assertGreater(info.same_host["copy_out"], 0)
                        # And into a new array, which keeps A's layout.
                        info = self.job(self.client, dtype, order, side, use_out=False)
                        self.assertEqual(info.mode, "shm")
        # Two staging regions did it all: 2 MiB for the 1.1 MB jobs, then
        # 4 MiB for the 2.2 MB ones (the smallest free one that fits is taken).
        sizes = sorted(r.byte_size for r in self.staging().values())
        self.assertEqual(sizes, [staging_size(ROWS * COLS * 4), staging_size(ROWS * COLS * 8)])

    def test_under_one_mib_goes_over_the_socket_without_a_reason(self):
        info = self.job(self.client, np.float64, rows=300, cols=400)  # 960000 bytes
        self.assertEqual(set(info.same_host.values()), {0.0})
        self.assertEqual((info.mode, info.socket_reason), ("unary", ""))
        self.assertEqual(self.staging(), {})

    def test_same_host_false_uses_the_socket(self):
        client = self.new_client(same_host=False)
        for dtype in (np.float32, np.float64):
            info = self.job(client, dtype, "F", "left")
            self.assertIn(info.mode, ("unary", "stream"))
            self.assertEqual(info.socket_reason, "")
        self.assertEqual(self.staging(), {})

    def test_a_forced_stream_uses_the_socket(self):
        info = self.job(self.client, np.float64, stream=True)
        self.assertEqual((info.mode, info.socket_reason), ("stream", ""))

    def test_the_staging_region_grows_by_powers_of_two_and_is_reused(self):
        seen = []
        for n in (400, 600, 1000):  # 1.28 MB, 2.88 MB, 8 MB of float64
            info = self.job(self.client, np.float64, rows=n, cols=n)
            self.assertEqual(info.mode, "shm")
            staging = self.staging()
            sizes = sorted(r.byte_size for r in staging.values())
            self.assertEqual(max(sizes), staging_size(n * n * 8), sizes)
            self.assertTrue(all(r.sealed and r.kind == pb.REGION_KIND_SYSTEM_SHM
                                and r.owner_uid == os.getuid() for r in staging.values()))
            seen.append(sizes)
        self.assertEqual(seen, [[2 * MIB], [2 * MIB, 4 * MIB], [2 * MIB, 4 * MIB, 8 * MIB]])
        # Smaller jobs again: the smallest free region that fits, no new one.
        jobs_before = {name: r.jobs_total for name, r in self.staging().items()}
        for n, mode in ((400, "unary"), (600, "shm"), (1000, "shm")):
            self.assertEqual(self.job(self.client, np.float32, rows=n, cols=n).mode, mode)
        after = self.staging()
        self.assertEqual(set(after), set(jobs_before))
        used = sorted(after[name].byte_size for name in after
                      if after[name].jobs_total > jobs_before[name])
        # float32: 640 kB (the socket), 1.44 MB (2 MiB), 4 MB (4 MiB).
        self.assertEqual(used, [2 * MIB, 4 * MIB])
        self.assertEqual(self.observer.region_status().registered_bytes, 14 * MIB)

    def two_clients_from_two_threads(self):
        """Four checked jobs on each of two Clients of this process, in two
        threads at once; [[MultiplyInfo] * 4] * 2."""
        clients = [self.client, self.new_client()]
        barrier = threading.Barrier(2)
        results = [[], []]
        errors = []

        def run(i):
            try:
                rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
                barrier.wait(10)
                for k in range(4):
                    dtype = (np.float32, np.float64)[(i + k) % 2]
                    a = rng.uniform(-4, 4, (ROWS + 10 * i, COLS)).astype(dtype)
                    d = rng.uniform(-4, 4, COLS).astype(dtype)
                    out = np.full(a.shape, np.nan, dtype)
                    c, info = clients[i].multiply(a, d, out=out, return_info=True)
                    results[i].append((c, a, d, info))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        for i in range(2):
            self.assertEqual(len(results[i]), 4)
            for c, a, d, info in results[i]:
                self.check(c, a, d, "right")
        return [[info for _, _, _, info in results[i]] for i in range(2)]

    def test_two_clients_in_one_process_from_two_threads_at_once(self):
        # Staging names are unique per uid (a process-wide counter and a
        # random part), so both clients take the same-host path.
        for infos in self.two_clients_from_two_threads():
            for info in infos:
                self.assertEqual((info.mode, info.socket_reason), ("shm", ""))

    def test_two_processes_at_once(self):
        script = textwrap.dedent("""
            import json, os, sys
            import numpy as np, dgmm
            address, seed = sys.argv[1], int(sys.argv[2])
            rng = np.random.default_rng(seed)
            out = []
            with dgmm.Client(address) as client:
                sys.stdout.write("ready\\n"); sys.stdout.flush()
                sys.stdin.readline()  # go
                for k in range(4):
                    dtype = (np.float32, np.float64)[k % 2]
                    order = "CF"[k // 2]
                    a = np.asarray(rng.uniform(-4, 4, (600, 500)).astype(dtype), order=order)
                    d = rng.uniform(-4, 4, 500).astype(dtype)
                    c = np.full(a.shape, np.nan, dtype, order=order)
                    _, info = client.multiply(a, d, out=c, return_info=True)
                    ref = a.astype(np.float64) * d.astype(np.float64)
                    nan = bool(np.isnan(c).any())
                    err = float(np.max(np.abs(c - ref) / np.maximum(np.abs(ref), 1e-300)))
                    out.append([info.mode, info.socket_reason, nan, err, str(np.dtype(dtype))])
            print(json.dumps({"pid": os.getpid(), "jobs": out}))
        """)
        procs = [subprocess.Popen([sys.executable, "-c", script, self.address, str(seed)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for seed in (1 + int.from_bytes(os.urandom(2), "little"), 7)]
        try:
            for p in procs:
                self.assertEqual(p.stdout.readline(), "ready\n")
            for p in procs:  # Both are connected: go.
                p.stdin.write("\n")
                p.stdin.flush()
            reports = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                p.stdin.close()
                p.stdout.close()
        for p, report in zip(procs, reports):
            self.assertEqual(p.returncode, 0)
            self.assertEqual(len(report["jobs"]), 4)
            for mode, reason, nan, err, dtype in report["jobs"]:
                self.assertEqual((mode, reason, nan), ("shm", "", False))
                self.assertLessEqual(err, tolerance(dtype))

    def test_a_client_killed_mid_job_leaves_nothing_registered_or_reserved(self):
        script = textwrap.dedent("""
            import sys
            import numpy as np, dgmm
            client = dgmm.Client(sys.argv[1], process_memory=False)
            a = np.random.default_rng(3).uniform(-1, 1, (2500, 2500))  # 50 MB
            d = np.ones(2500)
            c = np.empty_like(a)
            sys.stdout.write("looping\\n"); sys.stdout.flush()
            while True:
                client.multiply(a, d, out=c)
        """)
        # Until the server runs a job on the child's staging region.
        self.kill_child_mid_job(
            script, "looping\n",
            lambda child: any(r.jobs_in_use > 0 for r in self.staging(child.pid).values()),
            "the child's staging region never had a job in use")
        self.assertTrue(wait_until(
            lambda: self.observer.region_status().registered_bytes == 0, 5),
            self.observer.region_status())
        self.assertTrue(wait_until(
            lambda: all(d.reserved_bytes == 0 for d in self.observer.server_info().devices), 5),
            self.observer.server_info())
        # The server carries on.
        self.assertEqual(self.job(self.client).mode, "shm")


class ProcessMemoryTest(SameHostTestCase):
    """The default: the server reads A from, and writes C into, this
    process's own arrays; no staging region, no copy."""
    process_memory = True

    def test_every_dtype_layout_and_side_without_a_copy(self):
        for dtype in (np.float32, np.float64):
            for order in "CF":
                for side in ("right", "left"):
                    with self.subTest(dtype=dtype.__name__, order=order, side=side):
                        info = self.job(self.client, dtype, order, side)
                        self.assertEqual((info.mode, info.socket_reason, info.process_memory),
                                         ("shm", "", True))
                        self.assertEqual((info.same_host["copy_in"], info.same_host["copy_out"]),
                                         (0.0, 0.0))
                        self.assertGreater(info.same_host["job"], 0)
                        info = self.job(self.client, dtype, order, side, use_out=False)
                        self.assertEqual((info.mode, info.process_memory), ("shm", True))
        self.assertEqual(self.staging(), {})  # no staging region was made

    def test_the_default_client_takes_it(self):
        with dgmm.Client(self.address) as client:
            info = self.job(client, np.float32)
        self.assertEqual((info.mode, info.process_memory), ("shm", True))

    def test_off_uses_the_staging_region(self):
        info = self.job(self.new_client(process_memory=False), np.float64)
        self.assertEqual((info.mode, info.process_memory), ("shm", False))
        self.assertGreater(info.same_host["copy_in"], 0)

    def test_a_client_killed_mid_job_leaves_nothing_reserved(self):
        script = textwrap.dedent("""
            import sys
            import numpy as np, dgmm
            client = dgmm.Client(sys.argv[1])
            a = np.random.default_rng(3).uniform(-1, 1, (2500, 2500))  # 50 MB
            d = np.ones(2500)
            c = np.empty_like(a)
            _, info = client.multiply(a, d, out=c, return_info=True)
            sys.stdout.write("looping %s\\n" % info.process_memory); sys.stdout.flush()
            while True:
                client.multiply(a, d, out=c)
        """)
        self.kill_child_mid_job(
            script, "looping True\n",
            lambda child: any(d.reserved_bytes > 0 for d in self.observer.server_info().devices),
            "no job of the child was ever seen running")
        self.assertTrue(wait_until(
            lambda: all(d.reserved_bytes == 0 for d in self.observer.server_info().devices), 5),
            self.observer.server_info())
        info = self.job(self.client)
        self.assertEqual((info.mode, info.process_memory), ("shm", True))


class ServerDefaultsTest(SameHostTestCase):
    """A server started with its defaults serves regions: the default
    client takes the same-host path (process memory) to it without flags."""
    process_memory = True

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(flags=("--threads=2",), prefix="dgmm-py-defaults-",
                                   server_defaults=True)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_the_default_client_takes_the_same_host_path(self):
        self.assertTrue(self.observer.server_info().limits.regions_enabled)
        with dgmm.Client(self.address) as client:
            for dtype, order, side in ((np.float32, "C", "right"), (np.float64, "F", "left")):
                with self.subTest(dtype=dtype.__name__, order=order, side=side):
                    info = self.job(client, dtype, order, side)
                    self.assertEqual((info.mode, info.socket_reason, info.process_memory),
                                     ("shm", "", True))


class RegionsOffTest(SameHostTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_the_socket_carries_the_job_and_the_reason_says_why(self):
        for dtype in (np.float32, np.float64):
            for order in "CF":
                with self.subTest(dtype=dtype.__name__, order=order):
                    info = self.job(self.client, dtype, order, "left")
                    self.assertEqual(info.mode, "unary")
                    # The C++ client prefixes the code only the first time:
                    # later jobs (the finding is kept 60 s) give the message.
                    self.assertIn("--allow_regions", info.socket_reason)
                    if (dtype, order) == (np.float32, "C"):
                        self.assertIn("FAILED_PRECONDITION", info.socket_reason)

    def test_dgmm_arrays_need_regions(self):
        with self.assertRaises(dgmm.DgmmError) as raised:
            dgmm.empty((4, 4), client=self.client)
        self.assertEqual(raised.exception.code, grpc.StatusCode.FAILED_PRECONDITION)


class SmallBudgetTest(SameHostTestCase):
    """A region budget (1 MiB) smaller than any staging region (>= 2 MiB here)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--allow_regions", "--region_memory_budget=1MiB",
                            "--max_region_share_percent=100")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_the_socket_carries_the_job_with_resource_exhausted(self):
        for attempt in range(2):  # Tried again for every job, not remembered.
            with self.subTest(attempt=attempt):
                info = self.job(self.client, np.float64, "F", "right")
                self.assertEqual(info.mode, "unary")
                self.assertIn("RESOURCE_EXHAUSTED", info.socket_reason)
                self.assertIn("budget", info.socket_reason)
        self.assertEqual(self.observer.region_status().registered_bytes, 0)

    def test_a_dgmm_array_whose_result_does_not_fit_goes_over_the_socket(self):
        a = dgmm.empty((128, 1024), np.float64, client=self.client)  # 1 MiB: the whole budget
        a[:] = self.random(a.shape, np.float64)
        before = a.copy()
        with self.assertRaises(dgmm.DgmmError) as raised:
            dgmm.empty((2, 2), np.float64, client=self.client)
        self.assertEqual(raised.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        d = self.random(1024, np.float64)
        # out=None: no region for C, so the C++ client's path (no staging either).
        c, info = self.client.multiply(a, d, return_info=True)
        self.assertEqual(info.mode, "unary")
        self.assertIn("RESOURCE_EXHAUSTED", info.socket_reason)
        self.assertIsNone(dgmm.region_of(c))
        self.check(c, before, d, "right")
        # In place needs no other region.
        c, info = self.client.multiply(a, d, out=a, return_info=True)
        self.assertEqual((info.mode, info.socket_reason), ("shm", ""))
        self.check(a, before, d, "right")


# A job long enough to be cancelled mid-way on the CPU server: 484 MB in place
# (the module's server has a region budget of 512 MiB).
LONG_N = 11000
# A child with one long job on dgmm arrays, in place: SIGINT once the server
# runs it; then one small job on the same client.
CTRL_C_ARRAYS_CHILD = textwrap.dedent("""
    import sys, numpy as np, dgmm
    n = int(sys.argv[2])
    client = dgmm.Client(sys.argv[1])
    a = dgmm.empty((n, n), np.float32, client=client)
    a[:] = 1.5
    d = np.full(n, 2.0, np.float32)
    print("ready", flush=True)
    try:
        client.multiply(a, d, out=a)
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    small = dgmm.asarray(np.ones((30, 20)), client=client)
    c, info = client.multiply(small, np.full(20, 3.0), out=small, return_info=True)
    print("after", info.mode, bool((c == 3.0).all()), flush=True)
""")


class ArraysTest(SameHostTestCase):
    def region_jobs(self, array):
        region = dgmm.region_of(array)
        return self.observer.region_status(region.name).regions[0].jobs_total

    def test_empty_zeros_asarray(self):
        a = dgmm.empty((3, 5), np.float32, client=self.client, order="F")
        self.assertEqual((a.shape, a.dtype, a.flags.f_contiguous, a.flags.writeable),
                         ((3, 5), np.dtype(np.float32), True, True))
        z = dgmm.zeros((7,), client=self.client)
        self.assertEqual(z.dtype, np.float64)
        self.assertTrue((z == 0).all())
        for array in (a, z, a[1:], a.T):
            region = dgmm.region_of(array)
            self.assertIsNotNone(region)
            self.assertTrue(region.registered)
            self.assertTrue(region.sealed)
        names = {dgmm.region_of(a).name, dgmm.region_of(z).name}
        self.assertEqual(len(names), 2)
        listed = {r.name: r for r in self.observer.region_status().regions}
        self.assertTrue(names <= set(listed), (names, listed.keys()))
        self.assertIsNone(dgmm.region_of(np.zeros(3)))
        # asarray: a copy in, keeping the order; an array already there is itself.
        x = self.random((40, 30), np.float64, "F")
        b = dgmm.asarray(x, client=self.client)
        self.assertIsNotNone(dgmm.region_of(b))
        self.assertTrue(b.flags.f_contiguous)
        np.testing.assert_array_equal(b, x)
        self.assertIs(dgmm.asarray(b, client=self.client), b)
        self.assertIsNot(dgmm.asarray(b, client=self.new_client()), b)
        self.assertEqual(dgmm.asarray(np.arange(6).reshape(2, 3), client=self.client).dtype,
                         np.float64)
        self.assertEqual(dgmm.asarray(b, np.float32, client=self.client).dtype, np.float32)
        with self.assertRaises(ValueError):
            dgmm.empty((2, 2), np.int32, client=self.client)
        with self.assertRaises(TypeError):
            dgmm.empty((2, 2), client=None)

    def test_jobs_on_dgmm_arrays_copy_nothing(self):
        for dtype in (np.float32, np.float64):
            for order in "CF":
                for side in ("right", "left"):
                    with self.subTest(dtype=dtype.__name__, order=order, side=side):
                        rows, cols = 97, 61  # small: the C++ path would take the socket
                        a = dgmm.asarray(self.random((rows, cols), dtype, order),
                                         client=self.client)
                        before = a.copy(order="A")
                        c = dgmm.empty_like(a, client=self.client)
                        c[:] = np.nan
                        d = self.random(cols if side == "right" else rows, dtype)
                        jobs = self.region_jobs(a), self.region_jobs(c)
                        result, stats, info = self.client.multiply(
                            a, d, side=side, out=c, return_stats=True, return_info=True)
                        self.assertIs(result, c)
                        self.assertEqual((info.mode, info.socket_reason, info.stripes,
                                          info.attempts), ("shm", "", 1, 1))
                        self.assertEqual(stats.backend, pb.BACKEND_CPU)
                        self.check(c, before, d, side)
                        np.testing.assert_array_equal(a, before)
                        # The job ran on both regions; no staging region was made.
                        self.assertEqual((self.region_jobs(a), self.region_jobs(c)),
                                         (jobs[0] + 1, jobs[1] + 1))
                        # In place.
                        result, info = self.client.multiply(a, d, side=side, out=a,
                                                            return_info=True)
                        self.assertIs(result, a)
                        self.assertEqual(info.mode, "shm")
                        self.check(a, before, d, side)
        self.assertEqual(self.staging(), {})

    def test_every_other_dtype_on_dgmm_arrays(self):
        # float16 (and bfloat16 with ml_dtypes): bit for bit against float32
        # arithmetic rounded once (docs/dtypes.md); complex: against complex128.
        dtypes = [np.dtype(np.float16), np.dtype(np.complex64), np.dtype(np.complex128)]
        try:
            import ml_dtypes
            dtypes.append(np.dtype(ml_dtypes.bfloat16))
        except ImportError:
            pass
        for dtype in dtypes:
            for order in "CF":
                for side in ("right", "left"):
                    with self.subTest(dtype=dtype.name, order=order, side=side):
                        rows, cols = 97, 61
                        n = cols if side == "right" else rows
                        if dtype.kind == "c":
                            a0 = self.rng.uniform(-4, 4, (rows, cols)) + \
                                1j * self.rng.uniform(-4, 4, (rows, cols))
                            d = (self.rng.uniform(-4, 4, n) + 1j * self.rng.uniform(-4, 4, n))
                        else:
                            a0, d = self.rng.uniform(-4, 4, (rows, cols)), self.rng.uniform(-4, 4, n)
                        a = dgmm.asarray(np.asarray(a0, order=order).astype(dtype),
                                         client=self.client)
                        d = d.astype(dtype)
                        self.assertEqual(a.dtype, dtype)
                        self.assertTrue(a.flags[order + "_CONTIGUOUS"])
                        c = dgmm.empty_like(a, client=self.client)
                        c[:] = np.nan
                        jobs = self.region_jobs(a), self.region_jobs(c)
                        result, info = self.client.multiply(a, d, side=side, out=c,
                                                            return_info=True)
                        self.assertIs(result, c)
                        self.assertEqual(info.mode, "shm")
                        self.assertEqual((self.region_jobs(a), self.region_jobs(c)),
                                         (jobs[0] + 1, jobs[1] + 1))
                        wide = np.complex128 if dtype.kind == "c" else np.float32
                        aw, dw = a.astype(wide), d.astype(wide)
                        want = aw * dw[None, :] if side == "right" else dw[:, None] * aw
                        if dtype.kind == "c":
                            self.assertFalse(np.isnan(c).any())
                            np.testing.assert_allclose(
                                c, want, rtol=1e-6 if dtype == np.complex64 else 1e-14, atol=0)
                        else:
                            np.testing.assert_array_equal(c.view(np.uint16),
                                                          want.astype(dtype).view(np.uint16))

    def test_a_list_diagonal_gives_the_result_dtype_a_plain_array_would(self):
        # NumPy's result_type of A and np.asarray(d): a float list is float64,
        # a complex list complex128, with A in a dgmm array as with a plain one.
        a = dgmm.asarray(self.random((600, 500), np.float32), client=self.client)  # 1.2 MB
        for d, want_dtype in ((list(self.rng.uniform(-4, 4, 500)), np.float64),
                              (list(self.rng.uniform(-4, 4, 500) + 1j), np.complex128)):
            with self.subTest(dtype=want_dtype.__name__):
                c = self.client.multiply(a, d)
                plain = self.client.multiply(np.array(a), d)
                self.assertEqual(c.dtype, np.dtype(want_dtype))
                self.assertEqual(plain.dtype, np.dtype(want_dtype))
                want = a.astype(np.complex128) * np.asarray(d, dtype=np.complex128)[None, :]
                np.testing.assert_allclose(c, want, rtol=1e-14, atol=0)
                np.testing.assert_array_equal(c, plain)

    def test_a_diagonal_in_a_dgmm_array_and_a_new_result_array(self):
        a = dgmm.asarray(self.random((800, 400), np.float32), client=self.client)  # 1.28 MB
        d = dgmm.asarray(self.random(400, np.float32), client=self.client)
        jobs = self.region_jobs(d)
        c, info = self.client.multiply(a, d, return_info=True)
        self.assertEqual(info.mode, "shm")
        self.assertIsNotNone(dgmm.region_of(c))  # C is a dgmm array too
        self.assertEqual(self.region_jobs(d), jobs + 1)  # the server read d there
        self.check(c, a, d, "right")
        # A small one with out=None: the socket, a plain new array.
        small = dgmm.asarray(self.random((20, 10), np.float64), client=self.client)
        c, info = self.client.multiply(small, np.ones(10), return_info=True)
        self.assertEqual(info.mode, "unary")
        self.assertIsNone(dgmm.region_of(c))
        self.assertEqual(self.staging(), {})

    def test_arrays_of_another_client_and_mixed_arrays_take_the_normal_path(self):
        other = self.new_client()
        a = dgmm.asarray(self.random((ROWS, COLS), np.float64), client=other)
        d = self.random(COLS, np.float64)
        for out in (np.full(a.shape, np.nan), None):
            c, info = self.client.multiply(a, d, out=out, return_info=True)
            self.assertEqual(info.mode, "shm")  # staging: copied in and out
            self.check(c, a, d, "right")
            self.assertIsNone(dgmm.region_of(c))
        self.assertNotEqual(self.staging(), {})
        # A plain A into a dgmm out: the normal path too.
        plain = self.random((30, 20), np.float32)
        out = dgmm.empty((30, 20), np.float32, client=self.client)
        out[:] = np.nan
        c, info = self.client.multiply(plain, np.ones(20, np.float32) * 2, out=out,
                                       return_info=True)
        self.assertIs(c, out)
        self.assertEqual(info.mode, "unary")
        self.check(out, plain, np.full(20, 2.0), "right")

    def test_a_region_the_server_no_longer_has_falls_back_to_the_socket(self):
        a = dgmm.asarray(self.random((50, 40), np.float64), client=self.client)
        c = dgmm.empty_like(a, client=self.client)
        c[:] = np.nan
        # Another client of this uid unregisters C's region by name.
        with grpc.insecure_channel(self.address) as channel:  # a raw call, as any client
            self.assertEqual(dgmm.pb_grpc.DgmmStub(channel).UnregisterRegion(
                pb.UnregisterRegionRequest(name=dgmm.region_of(c).name),
                metadata=self.observer.local_session().metadata()).unregistered, 1)
        d = self.random(40, np.float64)
        result, info = self.client.multiply(a, d, out=c, return_info=True)
        self.assertIs(result, c)
        self.assertEqual(info.mode, "unary")
        self.assertIn("NOT_FOUND", info.socket_reason)
        self.check(c, a, d, "right")

    def test_the_region_goes_with_the_last_view(self):
        a = dgmm.zeros((100, 100), client=self.client)
        name = dgmm.region_of(a).name
        view = a[10:20]
        del a
        gc.collect()

        def listed():
            return name in {r.name for r in self.observer.region_status().regions}
        self.assertTrue(listed())
        view[:] = 1.0  # Still mapped.
        del view
        gc.collect()
        self.assertTrue(wait_until(lambda: not listed(), 5))

    def test_a_dead_arrays_region_is_reused_and_zeros_are_still_zero(self):
        a = dgmm.empty((64, 100), client=self.client)
        a[:] = 7.0
        name = dgmm.region_of(a).name
        del a
        gc.collect()
        z = dgmm.zeros((100, 64), client=self.client)  # the same byte size
        self.assertEqual(dgmm.region_of(z).name, name)
        self.assertTrue((z == 0).all())
        # A loop of C = multiply(A, d) with out=None reuses its results' regions.
        a = dgmm.asarray(self.random((1024, 160), np.float64), client=self.client)  # 1.25 MiB
        d = self.random(160, np.float64)
        names = set()
        for _ in range(4):
            c, info = self.client.multiply(a, d, return_info=True)
            self.assertEqual(info.mode, "shm")
            self.check(c, a, d, "right")
            names.add(dgmm.region_of(c).name)
            c[:] = np.nan  # Dirty memory for the next job to overwrite.
        self.assertLessEqual(len(names), 2)

    def test_after_close_the_arrays_stay_usable(self):
        client = dgmm.Client(self.address)
        a = dgmm.asarray(self.random((30, 20), np.float64), client=client)
        client.close()
        a *= 2  # Still this process's memory.
        d = self.random(20, np.float64)
        c, info = self.client.multiply(a, d, return_info=True)
        self.assertEqual(info.mode, "unary")
        self.check(c, a, d, "right")

    def long_job_started(self, until):
        """Waits (up to 30 s) until the server runs or queues a job, or until()."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if running_jobs(self.observer) > 0:
                return True
            if until():
                return False
        return False

    def test_ctrl_c_cancels_a_job_on_dgmm_arrays(self):
        # The call is made by the C++ client on the main thread; SIGINT
        # cancels it on the server (the job does not complete), raises
        # KeyboardInterrupt, and leaves the client usable. A job that ended
        # before the signal came is not a test of that: up to 3 tries.
        outcomes = []
        for _ in range(3):
            before = completed_jobs(self.observer)
            child = subprocess.Popen([sys.executable, "-c", CTRL_C_ARRAYS_CHILD, self.address,
                                      str(LONG_N)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
            try:
                self.assertEqual(child.stdout.readline().strip(), "ready")
                self.assertTrue(self.long_job_started(lambda: child.poll() is not None),
                                "the child's job never ran")
                child.send_signal(signal.SIGINT)
                out, err = child.communicate(timeout=60)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            lines = out.split()
            outcomes.append(lines[0] if lines else err)
            if lines[:1] != ["interrupted"]:
                continue
            self.assertEqual(out.split("\n")[1], "after shm True", out + err)
            self.assertEqual(child.returncode, 0, err)
            # Only the small job completed: the long one was cancelled.
            self.assertEqual(completed_jobs(self.observer), before + 1)
            return
        self.fail("no try was interrupted mid-job: %s" % outcomes)

    def test_cancelling_the_task_cancels_a_job_on_dgmm_arrays(self):
        n = LONG_N
        before = completed_jobs(self.observer)

        async def main():
            async with dgmm.aio.Client(self.address) as client:
                a = dgmm.empty((n, n), np.float32, client=client.sync)
                a[:] = 1.5
                task = asyncio.ensure_future(client.multiply(a, np.ones(n, np.float32), out=a))
                while running_jobs(self.observer) == 0 and not task.done():
                    await asyncio.sleep(0.001)
                if task.done():
                    return "finished"
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    return "cancelled"
                return "finished"
        outcome = asyncio.run(main())
        if outcome == "finished":
            self.skipTest("the job ended before it could be cancelled")
        self.assertEqual(outcome, "cancelled")
        self.assertTrue(wait_until(lambda: running_jobs(self.observer) == 0, 10))
        self.assertEqual(completed_jobs(self.observer), before)

    def test_asyncio_client(self):
        async def main():
            async with dgmm.aio.Client(self.address) as client:
                a = dgmm.asarray(self.random((64, 48), np.float32), client=client)
                before = a.copy()
                d = self.random(48, np.float32)
                c, info = await client.multiply(a, d, out=a, return_info=True)
                self.assertIs(c, a)
                self.assertEqual(info.mode, "shm")
                self.check(a, before, d, "right")
        asyncio.run(main())

    def test_threads_sharing_one_client(self):
        arrays = [dgmm.asarray(self.random((200, 150), np.float64), client=self.client)
                  for _ in range(4)]
        befores = [a.copy() for a in arrays]
        d = self.random(150, np.float64)
        infos = [None] * 4

        def run(i):
            _, infos[i] = self.client.multiply(arrays[i], d, out=arrays[i], return_info=True)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for a, before, info in zip(arrays, befores, infos):
            self.assertEqual(info.mode, "shm")
            self.check(a, before, d, "right")


if __name__ == "__main__":
    unittest.main()
