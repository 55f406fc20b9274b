"""The binding of the C++ client (dgmm._core) as Python sees it, against the
real server over loopback: buffer-protocol inputs, results in place, jobs
off the GIL, asyncio (dgmm.aio) with task.cancel(), and Ctrl-C.

Run by ctest (test `python_binding`) with the build's venv, or by hand:
  DGMM_SERVER_BIN=build/service/dgmm-server build/python-venv/bin/python \\
    tests/python/test_binding.py -v
"""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

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
from dgmm_server import ServerProcess, reference, running_jobs, tolerance  # noqa: E402
import dgmm  # noqa: E402
import dgmm.aio  # noqa: E402

SERVER = None
# Small stream blocks make a large job long enough to cancel midway.
SLOW = dict(chunk_bytes=64 << 10, max_unary_message_bytes=1 << 20)


def setUpModule():
    global SERVER
    SERVER = ServerProcess(flags=["--threads=2"], prefix="dgmm-py-binding-")


def tearDownModule():
    if SERVER:
        SERVER.stop()


def wait_idle(client, seconds):
    """True once the server runs and queues no job (within `seconds`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if running_jobs(client) == 0:
            return True
        time.sleep(0.01)
    return False


def job(rng, shape, dtype=np.float64, order="C", side="right"):
    a = np.asarray(rng.uniform(-4, 4, shape), dtype=dtype, order=order)
    d = rng.uniform(-4, 4, shape[1] if side == "right" else shape[0]).astype(dtype)
    return a, d


class BufferTest(unittest.TestCase):
    def setUp(self):
        self.client = dgmm.Client(SERVER.address)
        self.rng = np.random.default_rng(21)

    def tearDown(self):
        self.client.close()

    def test_buffer_protocol_inputs_give_numpy_results(self):
        a, d = job(self.rng, (37, 23))
        c = self.client.multiply(memoryview(a), memoryview(d))
        self.assertIsInstance(c, np.ndarray)
        np.testing.assert_allclose(c, reference(a, d, "right"), rtol=tolerance(a.dtype), atol=0)
        f = np.asfortranarray(a)
        c = self.client.multiply(memoryview(f), d)
        self.assertTrue(c.flags.f_contiguous)
        np.testing.assert_allclose(c, reference(a, d, "right"), rtol=tolerance(a.dtype), atol=0)

    def test_out_is_filled_in_place_for_both_modes_and_a_is_left_alone(self):
        for stream in (False, True):
            with self.subTest(stream=stream):
                a, d = job(self.rng, (300, 200), np.float32, "F", "left")
                before = a.copy()
                out = np.full(a.shape, np.nan, np.float32, order="F")
                c = self.client.multiply(a, d, side="left", out=out, stream=stream)
                self.assertIs(c, out)
                np.testing.assert_allclose(out, reference(a, d, "left"),
                                           rtol=tolerance(np.float32), atol=0)
                np.testing.assert_array_equal(a, before)

    def test_other_threads_run_while_a_job_runs(self):
        # The job releases the GIL: a Python thread keeps counting meanwhile.
        a, d = job(self.rng, (6000, 2000))
        ticks = []
        stop = threading.Event()

        def tick():
            while not stop.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.001)
        t = threading.Thread(target=tick)
        t.start()
        try:
            with dgmm.Client(SERVER.address, **SLOW) as client:
                start = time.monotonic()
                c = client.multiply(a, d)
                end = time.monotonic()
        finally:
            stop.set()
            t.join()
        np.testing.assert_allclose(c, reference(a, d, "right"), rtol=tolerance(a.dtype), atol=0)
        # Holding the GIL through the job would leave the thread a tick or two.
        during = [x for x in ticks if start <= x <= end]
        self.assertGreater(end - start, 0.05, "the job was too short to tell")
        self.assertGreater(len(during), 5,
                           "the thread barely ran during a %.0f ms job" % ((end - start) * 1e3))

    def test_progress_error_cancels_the_job_and_is_raised(self):
        a, d = job(self.rng, (3000, 1000))
        calls = []

        def progress(done, total):
            calls.append((done, total))
            raise RuntimeError("stop here")
        with dgmm.Client(SERVER.address, **SLOW) as client:
            with self.assertRaisesRegex(RuntimeError, "stop here"):
                client.multiply(a, d, progress=progress)
            self.assertEqual(len(calls), 1)
            self.assertTrue(wait_idle(client, 5))

    def test_server_errors_keep_code_details_and_info(self):
        a, d = job(self.rng, (30, 20))
        with self.assertRaises(dgmm.DgmmError) as raised:
            self.client.multiply(a, d[:-1], return_info=True)
        e = raised.exception
        self.assertEqual(e.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("diagonal", e.details)
        self.assertEqual((e.info.mode, e.info.stripes, e.info.attempts), ("unary", 1, 1))
        self.assertIsNone(e.retry_after_ms)


class AsyncioTest(unittest.TestCase):
    def test_concurrent_jobs_are_correct_and_do_not_block_the_loop(self):
        rng = np.random.default_rng(22)
        jobs = [job(rng, (400 + 50 * i, 300), np.float32 if i % 2 else np.float64)
                for i in range(6)]

        async def main():
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)
            t = asyncio.ensure_future(ticker())
            async with dgmm.aio.Client(SERVER.address, **SLOW) as client:
                results = await asyncio.gather(*(client.multiply(a, d) for a, d in jobs))
                health = await client.health()
            t.cancel()
            return results, health, ticks
        results, health, ticks = asyncio.run(main())
        self.assertEqual(health, "SERVING")
        self.assertGreater(ticks, 5)
        for (a, d), c in zip(jobs, results):
            np.testing.assert_allclose(c, reference(a, d, "right"), rtol=tolerance(a.dtype),
                                       atol=0)

    def test_task_cancel_cancels_the_job_and_its_parts_and_not_another(self):
        rng = np.random.default_rng(23)
        a, d = job(rng, (8000, 2000))
        b, e = job(rng, (1500, 1000))
        out = np.full(a.shape, np.nan)

        async def main():
            loop = asyncio.get_running_loop()
            started = asyncio.Event()

            def progress(done, total):  # On the client's threads.
                loop.call_soon_threadsafe(started.set)
            async with dgmm.aio.Client(SERVER.address, **SLOW) as client:
                victim = asyncio.ensure_future(client.multiply(a, d, stripes=4, out=out,
                                                               progress=progress))
                other = asyncio.ensure_future(client.multiply(b, e, stripes=2))
                await started.wait()  # Result lines are arriving: every part is under way.
                self.assertFalse(victim.done(), "the job ended before it could be cancelled")
                cancelled_at = time.monotonic()
                victim.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await victim
                took = time.monotonic() - cancelled_at
                snapshot = out.copy()
                c = await other
                return took, snapshot, c
        took, snapshot, c = asyncio.run(main())
        print("\ncancelled in %.1f ms" % (took * 1e3))
        self.assertLess(took, 0.5)
        np.testing.assert_allclose(c, reference(b, e, "right"), rtol=tolerance(b.dtype), atol=0)
        time.sleep(0.2)
        np.testing.assert_array_equal(out, snapshot)  # Nothing written after the cancel.
        self.assertTrue(np.isnan(out).any(), "the job finished: nothing was cancelled")
        with dgmm.Client(SERVER.address) as probe:
            self.assertTrue(wait_idle(probe, 5), "the server still runs the cancelled parts")


class PushbackTest(unittest.TestCase):
    def test_a_full_client_queue_gives_retry_after_ms(self):
        # The budget holds one streamed job (33.5 MB: a window of 4 MiB
        # blocks) and the queue one more: a third job, from the client that
        # has the most waiting, is refused at once with the server's
        # grpc-retry-pushback-ms trailer.
        server = ServerProcess(flags=["--max_queue=1", "--host_memory_budget=40MiB"],
                               prefix="dgmm-py-pushback-")
        rng = np.random.default_rng(24)
        big, big_d = job(rng, (8000, 2000))
        small, small_d = job(rng, (20, 10))

        async def main():
            loop = asyncio.get_running_loop()
            started = asyncio.Event()
            async with dgmm.aio.Client(server.address, retry=dgmm.RetryPolicy(max_attempts=1),
                                       **SLOW) as client:
                running = asyncio.ensure_future(client.multiply(  # One part: one job.
                    big, big_d, stripes=1,
                    progress=lambda *_: loop.call_soon_threadsafe(started.set)))
                await asyncio.wait_for(started.wait(), 60)  # the big job runs
                waiting = asyncio.ensure_future(client.multiply(big, big_d, stripes=1))
                while running_jobs(client.sync) < 2 and not running.done():
                    await asyncio.sleep(0.005)
                self.assertFalse(running.done(), "the first job ended too soon")
                with self.assertRaises(dgmm.DgmmError) as raised:
                    await client.multiply(small, small_d)
                results = await asyncio.gather(running, waiting)
                return raised.exception, results
        try:
            error, (c_big, c_waited) = asyncio.run(main())
        finally:
            server.stop()
        self.assertEqual(error.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIsNotNone(error.retry_after_ms, error.details)
        self.assertGreater(error.retry_after_ms, 0)
        self.assertEqual(error.info.attempts, 1)
        np.testing.assert_allclose(c_big, reference(big, big_d, "right"),
                                   rtol=tolerance(big.dtype), atol=0)
        np.testing.assert_allclose(c_waited, reference(big, big_d, "right"),
                                   rtol=tolerance(big.dtype), atol=0)


CTRL_C_CHILD = textwrap.dedent("""
    import sys, time, numpy as np, dgmm
    client = dgmm.Client(sys.argv[1], chunk_bytes=64 << 10)
    a = np.random.default_rng(1).uniform(-1, 1, (8000, 3000))
    d = np.ones(3000)
    started = []

    def progress(done, total):  # The first result lines: the job is under way.
        if not started:
            started.append(done)
            print("start", flush=True)
    try:
        client.multiply(a, d, stripes=2, progress=progress)
        print("finished")
    except KeyboardInterrupt:
        print("interrupted %.6f" % time.monotonic(), flush=True)
    c = client.multiply(a[:100], d)  # The client still works.
    print("after", bool(np.array_equal(c, a[:100] * d)), flush=True)
""")


class CtrlCTest(unittest.TestCase):
    def interrupt_once(self):
        """Runs the child, sends SIGINT once its job is under way; returns
        the seconds until its KeyboardInterrupt."""
        child = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD, SERVER.address],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.assertEqual(child.stdout.readline().strip(), "start")
            sent = time.monotonic()
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
        lines = out.split("\n")
        self.assertTrue(lines[0].startswith("interrupted"), out + err)
        self.assertEqual(lines[1], "after True", out + err)
        return float(lines[0].split()[1]) - sent

    def test_ctrl_c_cancels_a_synchronous_job_within_100_ms(self):
        # A loaded machine can delay any one process by tens of ms: up to
        # three tries, each a full interrupt; one under 100 ms passes.
        latencies = []
        for _ in range(3):
            latencies.append(self.interrupt_once())
            with dgmm.Client(SERVER.address) as probe:
                self.assertTrue(wait_idle(probe, 5), "the server still runs the interrupted job")
            if latencies[-1] < 0.1:
                break
        print("\nKeyboardInterrupt after SIGINT: %s ms" % ", ".join(
            "%.1f" % (x * 1e3) for x in latencies))
        self.assertLess(min(latencies), 0.1)


if __name__ == "__main__":
    unittest.main()
