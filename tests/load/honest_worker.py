#!/usr/bin/env python3
"""One honest client process of tests/load (honest_load.py).

It runs random jobs against a dgmm server through one of the project's client
libraries, with that library's default retry policy, and checks every result
against a float64 NumPy reference computed here on the same fresh random
inputs (the result is poisoned with NaN first, so a line never written is
wrong):

  --kind=python  the Python binding (dgmm.Client, one per process, `out=`
                 poisoned);
  --kind=node    client/node/dgmm.js in a child `node honest_worker.js`
                 process (inputs and result through files in --scratch);
  --kind=cli     the C++ client through dgmm-cli, one process per job
                 (.npy files in --scratch; the result file poisoned first).

--concurrency jobs are in flight at once (threads here; in the Node process,
promises; for the CLI, processes). Jobs start until --duration seconds have
passed or --jobs have started. Each job's record (one JSON object per job) is
written to --report at the end:
  {kind, rows, cols, dtype, layout, side, mode_asked, mode, bytes, status,
   details, attempts, correct, rel_err, seconds, started (time.time())}
status is "OK" or the final gRPC code's name; correct is None unless OK.
"""
import argparse
import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
MIB = 1 << 20


def tolerance(dtype):
    # tests/support/dgmm_server.py's: one product rounded to the dtype.
    return 1e-6 if np.dtype(dtype) == np.float32 else 1e-15


def reference(a, d, side):
    a64, d64 = np.asarray(a, dtype=np.float64), np.asarray(d, dtype=np.float64)
    return a64 * d64 if side == "right" else d64[:, None] * a64


def check(c, a, d, side):
    """(correct, largest relative error) of c against the float64 reference."""
    ref = reference(a, d, side)
    c64 = np.asarray(c, dtype=np.float64)
    if c64.shape != ref.shape:
        return False, float("inf")
    with np.errstate(invalid="ignore"):
        err = np.abs(c64 - ref) / np.abs(ref)  # |ref| >= 0.25: values in [0.5, 2)
    worst = float(np.max(err)) if err.size else 0.0
    if not np.all(np.isfinite(c64)) or math.isnan(worst):
        return False, float("inf")
    return worst <= tolerance(a.dtype), worst


def draw_job(rng, args):
    """A random job: shape log-uniform with matrix + diagonal bytes <= --max_bytes."""
    dtype = np.float32 if rng.random() < 0.5 else np.float64
    item = np.dtype(dtype).itemsize
    side = "right" if rng.random() < 0.5 else "left"
    cap = max(2, args.max_bytes // item)
    lo = max(1, args.min_bytes // item)
    while True:
        total = int(math.exp(rng.uniform(math.log(lo), math.log(cap))))
        rows = int(math.exp(rng.uniform(0, math.log(max(total, 1)))))
        rows = max(1, min(rows, total))
        cols = max(1, total // rows)
        if rng.random() < 0.5:
            rows, cols = cols, rows
        dlen = cols if side == "right" else rows
        layout = "col" if rng.random() < 0.5 else "row"
        line = (rows if layout == "col" else cols) * item
        if rows == 1 or cols == 1:
            # Both C- and Fortran-contiguous: NumPy, the binding and np.save
            # take it as C order, whatever the layout asked.
            line = max(rows, cols) * item
        # A line over the server's block limit cannot be streamed: a job the
        # mix forces to stream would be refused (INVALID_ARGUMENT, rightly),
        # so the random mix keeps lines within it; --edge_jobs covers the
        # policy's own choice for such jobs (unary).
        if rows * cols + dlen <= cap and max(rows, cols) <= args.max_dim and line <= args.max_block:
            break
    if args.mode == "mixed":
        mode = [None, False, True][int(rng.integers(0, 3))]
    else:
        mode = {"auto": None, "unary": False, "stream": True}[args.mode]
    return dict(rows=rows, cols=cols, dtype=dtype, layout=layout, side=side, stream=mode)


# Honest jobs at the edge of the client policy: under the unary limit (14.4 MiB
# with the diagonal) but over the 4 MiB stream chunk, with one line (4.8 MiB)
# over the server's 4 MiB block limit: streamed they cannot go, one Multiply
# they can. Run with the client's own choice of mode (stream=None).
EDGE_JOBS = [dict(rows=2, cols=600000, dtype=np.float64, layout="row", side="right", stream=None),
             dict(rows=600000, cols=2, dtype=np.float64, layout="col", side="left", stream=None)]


def make_inputs(rng, job):
    a = rng.random((job["rows"], job["cols"]), dtype=job["dtype"]) + job["dtype"](0.5)
    if job["layout"] == "col":
        a = np.asfortranarray(a)
    dlen = job["cols"] if job["side"] == "right" else job["rows"]
    d = rng.random(dlen, dtype=job["dtype"]) + job["dtype"](0.5)
    return a, d


def mode_name(stream):
    return {None: "auto", False: "unary", True: "stream"}[stream]


# ------------------------------------------------------------ the runners

class PythonRunner:
    def __init__(self, args):
        import dgmm
        self.dgmm = dgmm
        self.client = dgmm.Client(args.server)
        self.deadline = args.deadline

    def run(self, job, a, d, tag):
        out = np.full(a.shape, np.nan, dtype=a.dtype, order="F" if job["layout"] == "col" else "C")
        try:
            c, info = self.client.multiply(a, d, side=job["side"], timeout=self.deadline,
                                           stream=job["stream"], out=out, return_info=True)
            return dict(status="OK", details="", attempts=info.attempts, mode=info.mode,
                        resumed=info.resumed), c
        except self.dgmm.DgmmError as e:
            info = e.info
            return dict(status=e.code.name if e.code is not None else "UNKNOWN", details=e.details,
                        attempts=getattr(info, "attempts", 0) if info else 0,
                        mode=getattr(info, "mode", "") if info else "", resumed=0), None

    def close(self):
        self.client.close()


class CliRunner:
    ATTEMPTS = re.compile(r"mode:\s+(\w+), \d+ stripes?, (\d+) attempts?")

    def __init__(self, args):
        self.args = args

    def run(self, job, a, d, tag):
        base = os.path.join(self.args.scratch, tag)
        paths = {k: "%s.%s.npy" % (base, k) for k in ("a", "d", "c")}
        np.save(paths["a"], a)
        np.save(paths["d"], d)
        np.save(paths["c"], np.full(a.shape, np.nan, dtype=a.dtype,
                                    order="F" if job["layout"] == "col" else "C"))
        argv = [self.args.cli, "multiply", "--server", self.args.server, "--matrix", paths["a"],
                "--diag", paths["d"], "--out", paths["c"], "--side", job["side"],
                "--mode", mode_name(job["stream"]), "--deadline", str(self.args.deadline)]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=self.args.deadline + 30)
            m = self.ATTEMPTS.search(p.stdout)
            attempts, mode = (int(m.group(2)), m.group(1)) if m else (0, "")
            if p.returncode == 0:
                c = np.load(paths["c"])
                return dict(status="OK", details="", attempts=attempts, mode=mode, resumed=0), c
            err = (p.stderr.strip().splitlines() or ["?"])[-1]
            code = re.search(r"\b([A-Z_]{5,}):", err)
            return dict(status=code.group(1) if code else "EXIT_%d" % p.returncode, details=err,
                        attempts=attempts, mode=mode, resumed=0), None
        except subprocess.TimeoutExpired:
            return dict(status="HUNG", details="dgmm-cli did not exit", attempts=0, mode="",
                        resumed=0), None
        finally:
            for path in paths.values():
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def close(self):
        pass


class NodeRunner:
    def __init__(self, args):
        self.args = args
        self.proc = subprocess.Popen([args.node, os.path.join(HERE, "honest_worker.js"), args.server],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1)
        self.lock = threading.Lock()
        self.waiting = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            reply = json.loads(line)
            with self.lock:
                q = self.waiting.pop(reply["id"], None)
            if q is not None:
                q.put(reply)
        with self.lock:  # the process ended: nobody gets an answer any more
            for q in self.waiting.values():
                q.put(None)
            self.waiting.clear()

    def run(self, job, a, d, tag):
        base = os.path.join(self.args.scratch, tag)
        paths = {k: "%s.%s.bin" % (base, k) for k in ("a", "d", "c")}
        a.ravel(order="K").tofile(paths["a"])
        d.tofile(paths["d"])
        q = queue.Queue()
        with self.lock:
            self.waiting[tag] = q
        line = json.dumps(dict(id=tag, a=paths["a"], d=paths["d"], out=paths["c"], rows=job["rows"],
                               cols=job["cols"], dtype="f32" if job["dtype"] == np.float32 else "f64",
                               layout=job["layout"], side=job["side"], stream=job["stream"],
                               timeoutMs=int(self.args.deadline * 1000)))
        try:
            with self.lock:
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            reply = q.get(timeout=self.args.deadline + 30)
        except (queue.Empty, BrokenPipeError, OSError):
            reply = None
        try:
            if reply is None:
                return dict(status="HUNG", details="no answer from the node process", attempts=0,
                            mode="", resumed=0), None
            c = None
            if reply["status"] == "OK":
                flat = np.fromfile(paths["c"], dtype=a.dtype)
                order = "F" if job["layout"] == "col" else "C"
                c = flat.reshape(a.shape, order=order) if flat.size == a.size else flat
            return dict(status=reply["status"], details=reply.get("details", ""),
                        attempts=reply.get("attempts", 0), mode=reply.get("mode", ""),
                        resumed=reply.get("resumed", 0)), c
        finally:
            for path in paths.values():
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(30)
        except Exception:
            self.proc.kill()


RUNNERS = {"python": PythonRunner, "cli": CliRunner, "node": NodeRunner}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=sorted(RUNNERS), required=True)
    p.add_argument("--server", required=True, help="HOST:PORT")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--duration", type=float, default=10.0, help="start jobs for this many seconds")
    p.add_argument("--jobs", type=int, default=0, help="at most this many jobs (0: no cap)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--max_bytes", type=int, default=15 * MIB + MIB // 2,
                   help="largest matrix + diagonal (under the 16 MiB unary limit)")
    p.add_argument("--min_bytes", type=int, default=8)
    p.add_argument("--max_dim", type=int, default=1 << 20, help="the server's --max_dim")
    p.add_argument("--max_block", type=int, default=4 * MIB, help="the server's --max_block_bytes")
    p.add_argument("--edge_jobs", action="store_true",
                   help="first run the fixed edge jobs (EDGE_JOBS), with the client's own choice of mode")
    p.add_argument("--mode", default="mixed", choices=["mixed", "auto", "unary", "stream"])
    p.add_argument("--deadline", type=float, default=60.0, help="each job's deadline, seconds")
    p.add_argument("--cli", default="", help="dgmm-cli (--kind=cli)")
    p.add_argument("--node", default="node", help="node (--kind=node)")
    p.add_argument("--scratch", default="/dev/shm", help="files for --kind=cli/node")
    p.add_argument("--start_at", type=float, default=0.0,
                   help="time.time() to start at (so that every worker starts together)")
    p.add_argument("--report", required=True)
    args = p.parse_args()

    runner = RUNNERS[args.kind](args)
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))
    t_end = time.monotonic() + args.duration
    lock = threading.Lock()
    records = []
    counter = [0]

    def loop(thread_index):
        rng = np.random.default_rng([args.seed, thread_index])
        edge = list(EDGE_JOBS) if args.edge_jobs and thread_index == 0 else []
        while True:
            with lock:
                if not edge and (time.monotonic() >= t_end or (args.jobs and counter[0] >= args.jobs)):
                    return
                counter[0] += 1
                n = counter[0]
            is_edge = bool(edge)
            job = edge.pop(0) if edge else draw_job(rng, args)
            a, d = make_inputs(rng, job)
            tag = "dgmm-load-%d-%d" % (os.getpid(), n)
            started = time.time()
            t0 = time.monotonic()
            outcome, c = runner.run(job, a, d, tag)
            seconds = time.monotonic() - t0
            correct, err = (None, None)
            if outcome["status"] == "OK":
                correct, err = check(c, a, d, job["side"])
            rec = dict(kind=args.kind, rows=job["rows"], cols=job["cols"],
                       dtype="f32" if job["dtype"] == np.float32 else "f64", layout=job["layout"],
                       side=job["side"], mode_asked=mode_name(job["stream"]),
                       bytes=int(a.nbytes + d.nbytes), seconds=round(seconds, 4), started=started,
                       correct=correct, rel_err=err, edge=is_edge, **outcome)
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runner.close()
    with open(args.report + ".tmp", "w") as f:
        json.dump(records, f)
    os.replace(args.report + ".tmp", args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
