#!/usr/bin/env python3
"""Attacks a real dgmm-server on loopback the way a hostile or careless client
would, and prints one table: per attack, the server's peak RSS against its
host budget, its open descriptors, a second (well-behaved) client's success
rate and latency during the attack, and the time the server took to recover.

Every attack gets a fresh server (CPU backend, --host_memory_budget as given,
default 256MiB) listening on [::]:port; the attacker connects over IPv4
(127.0.0.1), the second client over IPv6 (::1), so the server sees two
clients. Needs Debian's python3-grpcio and python3-numpy.

  bench/attacks.py --server BUILD/service/dgmm-server [--short] [--out FILE.md]

--short uses small sizes (seconds in all); ./test.sh runs it as a test and it
exits non-zero when a target is missed:
  flood peak RSS <= budget + transport quota + 96 MiB (the documented overhead;
  Multiply, MultiplyBatch and MultiplySmall floods),
  the gzip bomb refused with peak RSS growth < 64 MiB, the listener serving
  again within 5 s of a descriptor flood, >= 95% of the second client's jobs
  OK under stalled streams, every client of a restarted server served within
  2 s of its first health answer, and no CANCELLED while draining.

The honest-load rows (honest_mixed, honest_fair, honest_fair_proxy,
honest_flood, honest_drain) run tests/load/honest_load.py: many
well-behaved client processes (Python binding, Node, dgmm-cli) with every
result checked; MET only when none is lost, wrong, refused after retries or
hung, the server's counters match the clients', and each refusal is counted. They need the built Python
binding (build/python) and dgmm-cli (--cli, default next to --server); Node
clients join when client/node's dependencies are installed.
"""
import argparse
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))

MIB = 1 << 20


# ------------------------------------------------------------ wire helpers

def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num, payload=None, value=None):
    if payload is None:
        return _varint(num << 3) + _varint(value)
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def job_header(rows, cols, diag=None):
    """A float32 row-major SIDE_RIGHT JobHeader."""
    d = diag if diag is not None else struct.pack("<f", 1.5) * cols
    return (_field(1, value=rows) + _field(2, value=cols) + _field(3, value=1) +
            _field(4, value=1) + _field(5, value=1) + _field(6, d))


def multiply_request(rows, cols, matrix=None):
    m = matrix if matrix is not None else (os.urandom(4096) * (rows * cols * 4 // 4096 + 1))[: rows * cols * 4]
    return _field(1, job_header(rows, cols)) + _field(2, m)


def stream_header(rows, cols):
    return _field(1, job_header(rows, cols))


def stream_block(first_line, data):
    return _field(2, _field(1, value=first_line) + _field(2, data))


def channel(target, own=True, transparent_retries=False):
    """An attacker's channel: no retries at all, so each refusal is seen once.
    transparent_retries=True keeps gRPC's default instead (retries on, no
    retry policy): gRPC then sends again only a call the server never saw,
    such as one that met a GOAWAY of gRPC's memory reclaimer on an idle
    connection (docs/operations.md section 12); what an ordinary client gets."""
    opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    if not transparent_retries:
        opts.append(("grpc.enable_retries", 0))
    if own:
        opts.append(("grpc.use_local_subchannel_pool", 1))
    return grpc.insecure_channel(target, options=opts)


# ---------------------------------------------------------------- server

class Server:
    def __init__(self, binary, flags, port=0, nofile=None):
        self.dir = tempfile.mkdtemp(prefix="dgmm-attack-")
        self.port_file = os.path.join(self.dir, "port")
        self.log_path = os.path.join(self.dir, "server.log")
        self.binary, self.flags, self.nofile = binary, flags, nofile
        self.start(port)

    def start(self, port=0):
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        args = [self.binary, "--listen=[::]:%d" % port, "--port_file=" + self.port_file] + self.flags

        def limits():
            if self.nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        self.proc = subprocess.Popen(args, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT,
                                     preexec_fn=limits)
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(self.port_file):
                text = open(self.port_file).read()
                if text.endswith("\n"):
                    self.port = int(text)
                    return
            if self.proc.poll() is not None:
                raise RuntimeError("dgmm-server exited: " + open(self.log_path).read())
            time.sleep(0.02)
        raise RuntimeError("dgmm-server did not start")

    def v4(self):
        return "127.0.0.1:%d" % self.port

    def v6(self):
        return "[::1]:%d" % self.port

    def status(self, key):
        try:
            for line in open("/proc/%d/status" % self.proc.pid):
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def rss(self):
        return self.status("VmRSS")

    def peak(self):
        return self.status("VmHWM")

    def fds(self):
        try:
            return len(os.listdir("/proc/%d/fd" % self.proc.pid))
        except OSError:
            return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self):
        return open(self.log_path, errors="replace").read()


class Watcher:
    """Samples the server's RSS and descriptors, and runs the second client:
    one small checked job over IPv6 every 50 ms."""

    def __init__(self, server, second_client=True):
        self.server = server
        self.max_rss = 0
        self.max_fds = 0
        self.ok = 0
        self.failed = 0
        self.latencies = []
        self.codes = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample, daemon=True)]
        if second_client:
            # The second client is connected before the attack starts, with
            # gRPC's default channel settings (an ordinary client); a call it
            # loses is counted with its code and message.
            self._ch = channel(self.server.v6(), transparent_retries=True)
            grpc.channel_ready_future(self._ch).result(timeout=10)
            self._threads.append(threading.Thread(target=self._client, daemon=True))
        for t in self._threads:
            t.start()

    def _sample(self):
        while not self._stop.is_set():
            self.max_rss = max(self.max_rss, self.server.rss())
            self.max_fds = max(self.max_fds, self.server.fds())
            time.sleep(0.02)

    def _client(self):
        ch = self._ch
        call = ch.unary_unary("/dgmm.v1.Dgmm/Multiply")
        req = multiply_request(64, 64)
        while not self._stop.is_set():
            t0 = time.time()
            try:
                reply = call(req, timeout=5)
                self.latencies.append(time.time() - t0)
                # The reply's field 1 holds C = A diag(1.5): check a few elements.
                self.ok += 1 if len(reply) > 64 * 64 * 4 else 0
            except grpc.RpcError as e:
                self.failed += 1
                key = "%s %s" % (e.code().name, (e.details() or "")[:40])
                self.codes[key] = self.codes.get(key, 0) + 1
            time.sleep(0.05)
        ch.close()

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def second(self):
        n = self.ok + self.failed
        if n == 0:
            return "-", "-"
        lat = sorted(self.latencies)
        p50 = lat[len(lat) // 2] * 1e3 if lat else float("nan")
        p99 = lat[min(len(lat) - 1, len(lat) * 99 // 100)] * 1e3 if lat else float("nan")
        failures = "".join("; %d x %s" % (v, k) for k, v in sorted(self.codes.items()))
        return ("%d/%d (%.0f%%%s)" % (self.ok, n, 100.0 * self.ok / n, failures),
                "p50 %.1f / p99 %.1f ms" % (p50, p99))


def wait_rss_below(server, limit, timeout=20):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if server.rss() <= limit:
            return time.time() - t0
        time.sleep(0.1)
    return None


# --------------------------------------------------------------- attacks

def concurrent_multiply(chans, req, method="/dgmm.v1.Dgmm/Multiply"):
    """One Multiply (or `method`) of `req` on each channel at once; counts of the outcomes."""
    futs = [c.unary_unary(method).future(req, timeout=120) for c in chans]
    codes = {}
    for f in futs:
        try:
            f.result()
            codes["OK"] = codes.get("OK", 0) + 1
        except grpc.RpcError as e:
            codes[e.code().name] = codes.get(e.code().name, 0) + 1
    return codes


def flood(server, req, calls, method="/dgmm.v1.Dgmm/Multiply"):
    """`calls` concurrent Multiply (or `method`) calls of `req`, one connection
    each, watched: (the watcher, the server's peak RSS, the status codes
    counted)."""
    w = Watcher(server)
    chans = [channel(server.v4()) for _ in range(calls)]
    codes = concurrent_multiply(chans, req, method)
    w.stop()
    peak = server.peak()
    for c in chans:
        c.close()
    return w, peak, codes


def unary_flood(args, budget):
    """C concurrent valid Multiply calls of S bytes over C connections."""
    calls, n = (24, 1024) if args.short else (128, 2000)  # 4 MiB / 16 MiB requests
    server = Server(args.server, args.flags)
    idle = server.rss()
    req = multiply_request(n, n)
    w, peak, codes = flood(server, req, calls)
    recover = wait_rss_below(server, idle + 64 * MIB)
    server.stop()
    return dict(attack="%d concurrent %d MiB Multiply calls, %d connections" % (calls, len(req) // MIB, calls),
                peak=peak, fds=w.max_fds, second=w.second(), recover=recover,
                outcome=" ".join("%s %d" % kv for kv in sorted(codes.items())),
                check=("flood", peak))


def batch_flood(args, budget):
    """C concurrent MultiplyBatch calls of S bytes (jobs of 64 KiB) over C connections."""
    calls, jobs = (24, 63) if args.short else (128, 250)  # 4 / 16 MiB batches, under 16 MiB
    server = Server(args.server, args.flags)
    idle = server.rss()
    job = multiply_request(128, 128)
    req = _field(1, job) * jobs
    w, peak, codes = flood(server, req, calls, "/dgmm.v1.Dgmm/MultiplyBatch")
    recover = wait_rss_below(server, idle + 64 * MIB)
    server.stop()
    return dict(attack="%d concurrent %d MiB MultiplyBatch calls of %d jobs, %d connections"
                % (calls, len(req) // MIB, jobs, calls),
                peak=peak, fds=w.max_fds, second=w.second(), recover=recover,
                outcome=" ".join("%s %d" % kv for kv in sorted(codes.items())),
                check=("flood", peak))


def oversized_unary(args, budget):
    """Multiply messages 4x over the unary limit."""
    calls = 8 if args.short else 32
    size_n = 4096  # 64 MiB, over the 16 MiB default
    server = Server(args.server, args.flags)
    req = multiply_request(size_n, size_n)
    w, peak, codes = flood(server, req, calls)
    server.stop()
    return dict(attack="%d concurrent 64 MiB Multiply calls over the 16 MiB limit" % calls,
                peak=peak, fds=w.max_fds, second=w.second(), recover=None,
                outcome=" ".join("%s %d" % kv for kv in sorted(codes.items())), check=("flood", peak))


def oversized_unary_sweep(args, budget):
    """Multiply messages 4x over the unary limit, the limit swept over 4, 8 and
    16 MiB: the peak must stay within budget + transport quota + the ~20 MiB
    the docs give as the fixed overhead, for every limit (gRPC takes in a
    message whole before the server can check it, so what over-limit reads
    hold must not grow as the limit shrinks), and the second client may lose
    no call but to the transport quota's reclaimer (RST_STREAM code 11, or a
    GOAWAY before the server saw the call), which docs/operations.md §12 says
    every dgmm client retries."""
    calls = 24 if args.short else 128
    peaks, outcomes, seconds, fds = [], [], [], 0
    second_ok = True
    for limit_mib in (4, 8, 16):
        flags = args.flags + ["--max_unary_message_bytes=%dMiB" % limit_mib]
        server = Server(args.server, flags)
        n = int((4 * limit_mib * MIB // 4) ** 0.5)  # float32 n x n: 4x the limit
        req = multiply_request(n, n)
        w, peak, codes = flood(server, req, calls)
        server.stop()
        peaks.append(peak)
        fds = max(fds, w.max_fds or 0)
        seconds.append(w.second())
        second_ok = second_ok and w.ok > 0 and all(
            "RST_STREAM with error code 11" in k or "GOAWAY" in k for k in w.codes)
        outcomes.append("%d MiB: %s, peak %d MiB" % (
            limit_mib, " ".join("%s %d" % kv for kv in sorted(codes.items())), peak // MIB))
    return dict(attack="%d concurrent Multiply calls 4x over --max_unary_message_bytes of 4, 8 "
                       "and 16 MiB" % calls,
                peak=max(peaks), fds=fds,
                second=("; ".join(s[0] for s in seconds), "; ".join(s[1] for s in seconds)),
                recover=None, outcome="; ".join(outcomes),
                check=("documented", (max(peaks), second_ok)))


def small_flood(args, budget):
    """MultiplySmall calls just under its 256 KiB limit, many per connection:
    gRPC reads each whole before the server sees it (no receive gate)."""
    conns, per = (8, 32) if args.short else (64, 64)
    n = 250  # 250 x 250 float32 and its diagonal: 251 KB
    server = Server(args.server, args.flags)
    idle = server.rss()
    req = multiply_request(n, n)
    w = Watcher(server)
    chans = [channel(server.v4()) for _ in range(conns)]
    codes = concurrent_multiply([c for c in chans for _ in range(per)], req,
                                "/dgmm.v1.Dgmm/MultiplySmall")
    w.stop()
    peak = server.peak()
    for c in chans:
        c.close()
    recover = wait_rss_below(server, idle + 64 * MIB)
    server.stop()
    return dict(attack="%d concurrent %d KB MultiplySmall calls, %d per connection"
                % (conns * per, len(req) // 1000, per),
                peak=peak, fds=w.max_fds, second=w.second(), recover=recover,
                outcome=" ".join("%s %d" % kv for kv in sorted(codes.items())),
                check=("flood", peak))


def oversized_small(args, budget):
    """MultiplySmall messages of 64 MiB, 256 times its limit."""
    calls = 8 if args.short else 32
    server = Server(args.server, args.flags)
    req = multiply_request(4096, 4096)
    w, peak, codes = flood(server, req, calls, "/dgmm.v1.Dgmm/MultiplySmall")
    server.stop()
    return dict(attack="%d concurrent 64 MiB MultiplySmall calls over its 256 KiB limit" % calls,
                peak=peak, fds=w.max_fds, second=w.second(), recover=None,
                outcome=" ".join("%s %d" % kv for kv in sorted(codes.items())), check=("flood", peak))


def oversized_control(args, budget):
    """GetServerInfo and GetRegionStatus requests of 64 MiB (their limit is
    64 KiB): gRPC reads a unary request whole; the server must not copy it
    again (a parse kept the bytes as unknown fields: 515-609 MiB peak before
    the size check)."""
    calls = 8 if args.short else 32
    server = Server(args.server, args.flags)
    req = multiply_request(4096, 4096)
    w = Watcher(server)
    codes = {}
    for method in ("/dgmm.v1.Dgmm/GetServerInfo", "/dgmm.v1.Dgmm/GetRegionStatus"):
        chans = [channel(server.v4()) for _ in range(calls // 2)]
        for k, v in concurrent_multiply(chans, req, method).items():
            codes[k] = codes.get(k, 0) + v
        for c in chans:
            c.close()
    w.stop()
    peak = server.peak()
    server.stop()
    return dict(attack="%d concurrent 64 MiB GetServerInfo and GetRegionStatus calls (limit 64 KiB)"
                % calls, peak=peak, fds=w.max_fds, second=w.second(), recover=None,
                outcome=" ".join("%s %d" % kv for kv in sorted(codes.items())), check=("flood", peak))


def oversized_block(args, budget):
    """One MultiplyStream block message far over --max_block_bytes."""
    size = (64 if args.short else 1024) * MIB
    server = Server(args.server, args.flags)
    w = Watcher(server)
    ch = channel(server.v4())
    call = ch.stream_stream("/dgmm.v1.Dgmm/MultiplyStream")
    block = stream_block(0, bytes(size - 64))

    def requests():
        yield stream_header(4096, 4096)
        yield block
    code = "OK"
    try:
        for _ in call(requests(), timeout=120):
            pass
    except grpc.RpcError as e:
        code = e.code().name
    w.stop()
    peak = server.peak()
    ch.close()
    server.stop()
    return dict(attack="one %d MiB block message (limit 4 MiB + 64 KiB)" % (size // MIB), peak=peak,
                fds=w.max_fds, second=w.second(), recover=None, outcome=code, check=("flood", peak))


def gzip_bomb(args, budget):
    """A Multiply of zeros, gzip-compressed on the wire."""
    n = 8192 if args.short else 11585  # 256 MiB / 512 MiB of zeros
    server = Server(args.server, args.flags + ["--max_unary_message_bytes=1GiB"])
    before = server.peak()
    w = Watcher(server)
    ch = channel(server.v4())
    call = ch.unary_unary("/dgmm.v1.Dgmm/Multiply")
    req = multiply_request(n, n, matrix=bytes(n * n * 4))
    code = "OK"
    try:
        call(req, timeout=120, compression=grpc.Compression.Gzip)
    except grpc.RpcError as e:
        code = "%s (%s)" % (e.code().name, e.details())
    w.stop()
    growth = server.peak() - before
    ch.close()
    server.stop()
    return dict(attack="gzip bomb: %d MiB of zeros, gzip-compressed on the wire" % (len(req) // MIB),
                peak=before + growth, fds=w.max_fds, second=w.second(),
                recover=None, outcome=code, check=("bomb", growth))


def descriptor_flood(args, budget):
    """More raw TCP connections than the open-files limit, then a new client."""
    limit = 256
    conns = 600 if args.short else 1100
    server = Server(args.server, args.flags, nofile=limit)
    w = Watcher(server)
    socks = []
    for _ in range(conns):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect(("127.0.0.1", server.port))
            socks.append(s)
        except OSError:
            s.close()
    time.sleep(1.0)
    for s in socks:
        s.close()
    t0 = time.time()
    recover = None
    while time.time() - t0 < 10:
        ch = channel(server.v4())
        try:
            ch.unary_unary("/dgmm.v1.Dgmm/GetServerInfo")(b"", timeout=1)
            recover = time.time() - t0
            ch.close()
            break
        except grpc.RpcError:
            ch.close()
    w.stop()
    dead = "Failed accept4" in server.log()
    peak = server.peak()
    server.stop()
    return dict(attack="%d raw connections against a %d-descriptor limit, then closed" % (conns, limit),
                peak=peak, fds=w.max_fds, second=w.second(), recover=recover,
                outcome="listener %s" % ("died (Failed accept4)" if dead else "kept accepting"),
                check=("emfile", recover if not dead else None))


def stalled_streams(args, budget):
    """One client opens ~1000 streams that send a header and then nothing."""
    per_conn, conns = 59, 17
    server = Server(args.server, args.flags)
    chans = [channel(server.v4()) for _ in range(conns)]
    release = threading.Event()
    calls = []

    def held():
        yield stream_header(2048, 2048)
        release.wait()
    for ch in chans:
        mcall = ch.stream_stream("/dgmm.v1.Dgmm/MultiplyStream")
        for _ in range(per_conn):
            calls.append(mcall(held(), timeout=60))
    time.sleep(1.0)
    w = Watcher(server)
    time.sleep(3.0 if args.short else 20.0)
    w.stop()
    peak = server.peak()
    release.set()
    for c in calls:
        c.cancel()
    for ch in chans:
        ch.close()
    server.stop()
    ok = w.ok / max(1, w.ok + w.failed)
    return dict(attack="%d stalled streams from one client (header, then nothing)" % len(calls),
                peak=peak, fds=w.max_fds, second=w.second(), recover=None,
                outcome="second client failures: %s" % (w.codes or "none"), check=("fair", ok))


def restart(args, budget):
    """16 busy clients, server SIGKILLed and restarted on its port 3 s later."""
    import numpy as np
    import dgmm
    clients_n = 8 if args.short else 16
    server = Server(args.server, args.flags)
    port = server.port
    stop = threading.Event()
    served_at = [None] * clients_n
    restarted = threading.Event()
    a = np.random.default_rng(1).random((64, 64), dtype=np.float32) + 0.5
    d = np.random.default_rng(2).random(64, dtype=np.float32) + 0.5

    def run(i):
        c = dgmm.Client("127.0.0.1:%d" % port)
        while not stop.is_set():
            try:
                out = c.multiply(a, d, timeout=10)
                ok = np.allclose(out, a * d[None, :], rtol=1e-6)
                if restarted.is_set() and ok and served_at[i] is None:
                    served_at[i] = time.time()
            except Exception:
                pass
            time.sleep(0.01)
        c.close()
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients_n)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    server.proc.kill()
    server.proc.wait()
    time.sleep(3.0)
    server.start(port)
    # When did it first answer health?
    ch = channel(server.v4())
    health = ch.unary_unary("/grpc.health.v1.Health/Check")
    while True:
        try:
            health(b"", timeout=1)
            break
        except grpc.RpcError:
            time.sleep(0.01)
    up = time.time()
    restarted.set()
    ch.close()
    t0 = time.time()
    while time.time() - t0 < 15 and any(s is None for s in served_at):
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(15)
    lat = [s - up if s is not None else None for s in served_at]
    peak = server.peak()
    server.stop()
    worst = None if any(x is None for x in lat) else max(max(lat), 0.0)
    return dict(attack="SIGKILL and restart 3 s later with %d busy Python clients" % clients_n,
                peak=peak, fds=0, second=("-", "-"),
                recover=worst, outcome="served %d of %d after restart" % (sum(x is not None for x in lat), clients_n),
                check=("reconnect", worst))


def drain(args, budget):
    """Calls racing SIGTERM: every refusal must be UNAVAILABLE."""
    server = Server(args.server, args.flags)
    stop = threading.Event()
    codes = {}
    term = threading.Event()
    lock = threading.Lock()

    def run():
        ch = channel(server.v4())
        call = ch.unary_unary("/dgmm.v1.Dgmm/Multiply")
        req = multiply_request(64, 64)
        while not stop.is_set():
            after = term.is_set()
            try:
                call(req, timeout=5)
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            if after:
                with lock:
                    codes[code] = codes.get(code, 0) + 1
        ch.close()
    threads = [threading.Thread(target=run, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    peak = server.peak()
    term.set()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join(10)
    return dict(attack="8 clients calling through SIGTERM", peak=peak, fds=0, second=("-", "-"),
                recover=None, outcome=" ".join("%s %d" % kv for kv in sorted(codes.items())),
                check=("drain", codes.get("CANCELLED", 0)))


# ------------------------------------------------------- honest load
#
# Not attacks: what well-behaved clients must get while the server defends
# itself. Each runs one test of tests/load/honest_load.py (many client
# processes through the Python binding, Node and dgmm-cli, every result
# checked against float64 NumPy) on its own fresh server(s) and is MET only
# when every assertion of that test holds (the failures are printed).
# ctest runs their short forms as honest_load_* (tests/load), so attacks_short
# skips them.

def _honest(args, test, *extra):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "load"))
    import honest_load
    argv = [test, "--server", args.server, "--budget", args.budget] + list(extra)
    if args.cli:
        argv += ["--cli", args.cli]
    if args.short:
        argv.append("--short")
    row, lines, fails = honest_load.run(argv)
    print("\n".join(lines), flush=True)
    for f in fails:
        print("  MISSED: " + f, flush=True)
    row["check"] = ("honest", fails)
    return row


def honest_mixed(args, budget):
    """64 honest client processes, 60 s of random jobs: none lost, wrong, refused or hung."""
    return _honest(args, "mixed")


def honest_fair(args, budget):
    """1000 stalled streams from one process, 16 honest processes on the same host."""
    return _honest(args, "fairness")


def honest_fair_proxy(args, budget):
    """The same, every connection through a TCP proxy (all clients at 127.0.0.1)."""
    return _honest(args, "fairness", "--proxy")


def honest_flood(args, budget):
    """Unary floods of 15 MiB calls at 64 and 128 in flight: refusals counted, none by the transport."""
    return _honest(args, "flood")


def honest_drain(args, budget):
    """Honest processes calling through SIGTERM: none hangs past the reconnect limit."""
    return _honest(args, "drain")


ATTACKS = [unary_flood, batch_flood, small_flood, oversized_unary, oversized_unary_sweep,
           oversized_small, oversized_control,
           oversized_block, gzip_bomb, descriptor_flood,
           stalled_streams, restart, drain, honest_mixed, honest_fair, honest_fair_proxy, honest_flood,
           honest_drain]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True, help="path of dgmm-server")
    p.add_argument("--short", action="store_true", help="small sizes, seconds in all")
    p.add_argument("--budget", default="256MiB", help="--host_memory_budget of the server")
    p.add_argument("--only", default="", help="comma-separated attack names")
    p.add_argument("--skip", default="", help="comma-separated attack names to leave out")
    p.add_argument("--cli", default="", help="dgmm-cli for the honest rows (default: next to the server)")
    p.add_argument("--out", default="", help="also write the table (markdown) here")
    args = p.parse_args()
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    budget = int(args.budget[:-3]) * units[args.budget[-3:]] if args.budget[-3:] in units else int(args.budget)
    # The transport quota the server derives (service/main.cc, auto).
    transport = max(min(max(budget // 2, 64 * MIB), 256 * MIB), 16 * MIB + 16 * MIB)
    args.flags = ["--backend=cpu", "--host_memory_budget=" + args.budget]
    chosen = [a for a in ATTACKS if (not args.only or a.__name__ in args.only.split(","))
              and a.__name__ not in args.skip.split(",")]
    rows, failures = [], []
    for attack in chosen:
        t0 = time.time()
        r = attack(args, budget)
        r["seconds"] = time.time() - t0
        kind, value = r["check"]
        ok = {
            "flood": lambda v: v <= budget + transport + 96 * MIB,
            # docs/operations.md §12: budget + transport + the ~20 MiB the
            # process takes idle, and no call of the second client lost.
            "documented": lambda v: v[0] <= budget + transport + 20 * MIB and v[1],
            "bomb": lambda v: v < 64 * MIB,
            "emfile": lambda v: v is not None and v <= 5,
            "fair": lambda v: v >= 0.95,
            "reconnect": lambda v: v is not None and v <= 2,
            "drain": lambda v: v == 0,
            "honest": lambda v: not v,
        }[kind](value)
        r["verdict"] = "MET" if ok else "MISSED"
        if not ok:
            failures.append(attack.__name__)
        rows.append(r)
        print("%-18s %s  (%.1f s)" % (attack.__name__, r["verdict"], r["seconds"]), flush=True)

    def fmt_recover(v):
        return "-" if v is None else "%.2f s" % v
    lines = ["| attack | outcome | peak RSS | peak / budget | max fds | second client OK | second client latency | recovery | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %s | %d MiB | %.2f | %s | %s | %s | %s | %s |" % (
            r["attack"], r["outcome"], r["peak"] // MIB, r["peak"] / budget, r["fds"] or "-",
            r["second"][0], r["second"][1], fmt_recover(r["recover"]), r["verdict"]))
    table = "\n".join(lines)
    print()
    print("budget %d MiB, transport quota %d MiB (flood target: peak <= %d MiB)" %
          (budget // MIB, transport // MIB, (budget + transport + 96 * MIB) // MIB))
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    if failures:
        print("MISSED: " + ", ".join(failures))
        return 1
    print("%d passed, 0 failed" % len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
