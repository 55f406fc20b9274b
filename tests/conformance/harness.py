#!/usr/bin/env python3
"""The client-policy conformance suite: runs every case of cases/*.json with one
language's runner against real dgmm-server processes, and checks the policy
vectors.

  harness.py --runner "CMD ..." --server BIN [--cases DIR] [--vectors FILE] [--name LANG]

For each case it starts `server.replicas` servers (with `server.flags`, on
loopback ephemeral ports, CPU backend unless the flags say otherwise), puts a
TCP proxy that resets connections (or single HTTP/2 streams) in front of them
when the case has `inject`, runs `CMD --case FILE --target TARGET`, reads the one JSON line it
prints and compares it with the case's `expect`. Then it runs
`CMD --vectors FILE`. It prints a table and exits 1 on any mismatch.
The runners and the contract: tests/conformance/README.md.
"""

import argparse
import json
import os
import selectors
import shlex
import socket
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from dgmm_server import ServerProcess  # noqa: E402


class Server(ServerProcess):
    """A dgmm-server (CPU backend unless the case's flags say) on an ephemeral
    loopback port."""

    def __init__(self, binary, flags):
        super().__init__(binary, flags, prefix="dgmm-conformance-")


class Http2DataCounter:
    """Follows one direction of an HTTP/2 connection frame by frame (9-byte
    headers: 24-bit length, type, flags, 31-bit stream id) and counts the
    payload bytes of its DATA frames: the gRPC messages, for the server to
    client direction the responses (StreamAccepted, result blocks). The server
    sends no connection preface, so frames start at byte 0. `reached` turns
    true at the end of the frame in which data_bytes reached `threshold`
    (at once when it is 0)."""

    DATA = 0

    def __init__(self, threshold):
        self.threshold = threshold
        self.data_bytes = 0
        self.reached = threshold <= 0
        self._header = b""   # the bytes of a frame header split across reads
        self._left = 0       # payload bytes of the current frame still to come
        self._is_data = False

    def feed(self, chunk):
        """Counts all of `chunk`; returns the length of its prefix that ends
        with the frame that made `reached` true, or None when it did not
        turn true in this chunk."""
        end = None
        i, n = 0, len(chunk)
        while i < n:
            if self._left == 0:
                take = min(9 - len(self._header), n - i)
                self._header += chunk[i:i + take]
                i += take
                if len(self._header) < 9:
                    break
                self._left = int.from_bytes(self._header[:3], "big")
                self._is_data = self._header[3] == self.DATA
                self._header = b""
            take = min(self._left, n - i)
            self._left -= take
            i += take
            if self._is_data:
                self.data_bytes += take
            if self._left == 0 and not self.reached and self.data_bytes >= self.threshold:
                self.reached = True
                end = i
        return end


class Http2MessageCutter:
    """Forwards one direction of an HTTP/2 connection in whole frames and
    counts the gRPC messages (5-byte prefix: flag, 32-bit length) that its
    DATA frames complete, per stream. feed() returns (bytes to forward,
    reached): once the `messages`-th message is complete, the bytes end with
    it, the DATA frame that holds its end cut short there (END_STREAM off),
    so that the peer gets exactly that many messages and the start of no
    other."""

    DATA, END_STREAM, PADDED = 0, 0x1, 0x8

    def __init__(self, messages):
        self.messages = messages
        self.count = 0
        self.reached = False
        self._buf = b""
        self._streams = {}  # stream id -> (prefix bytes read, message bytes left or None)

    def feed(self, chunk):
        self._buf += chunk
        out = []
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            if len(self._buf) < 9 + length:
                break
            header, payload = self._buf[:9], self._buf[9:9 + length]
            self._buf = self._buf[9 + length:]
            if header[3] == self.DATA and not header[4] & self.PADDED and not self.reached:
                end = self._walk(int.from_bytes(header[5:9], "big") & 0x7FFFFFFF, payload)
                if end is not None:
                    flags = header[4] & ~self.END_STREAM if end < length else header[4]
                    out.append(end.to_bytes(3, "big") + bytes([self.DATA, flags]) + header[5:9]
                               + payload[:end])
                    return b"".join(out), True
            out.append(header + payload)
        return b"".join(out), False

    def _walk(self, stream, payload):
        """Counts the messages `payload` completes on `stream`; the offset just
        after the one that reaches `messages`, else None."""
        prefix, left = self._streams.get(stream, (b"", None))
        i, n = 0, len(payload)
        while i < n:
            if left is None:
                take = min(5 - len(prefix), n - i)
                prefix += payload[i:i + take]
                i += take
                if len(prefix) < 5:
                    break
                left, prefix = int.from_bytes(prefix[1:], "big"), b""
            take = min(left, n - i)
            left -= take
            i += take
            if left == 0:
                left = None
                self.count += 1
                if self.count >= self.messages:
                    self.reached = True
                    return i
        self._streams[stream] = (prefix, left)
        return None


RST_STREAM, WINDOW_UPDATE = 3, 8
PROTOCOL_ERROR, CANCEL = 0x1, 0x8
CLIENT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def http2_frame(frame_type, flags, stream, payload):
    """One HTTP/2 frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return (len(payload).to_bytes(3, "big") + bytes([frame_type, flags])
            + (stream & 0x7FFFFFFF).to_bytes(4, "big") + payload)


class Http2Frames:
    """Splits one direction of an HTTP/2 connection into whole frames. The
    client's direction starts with the 24-byte connection preface, which
    comes out first as a frame of type None; the server sends none. feed()
    returns the frames its bytes complete, each (type, stream id, payload
    length, raw bytes); a frame split across reads waits for its end."""

    def __init__(self, preface):
        self._buf = b""
        self._preface_left = len(CLIENT_PREFACE) if preface else 0

    def feed(self, chunk):
        self._buf += chunk
        frames = []
        if self._preface_left:
            take = min(self._preface_left, len(self._buf))
            self._preface_left -= take
            frames.append((None, 0, 0, self._buf[:take]))
            self._buf = self._buf[take:]
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            if len(self._buf) < 9 + length:
                break
            frames.append((self._buf[3], int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF,
                           length, self._buf[:9 + length]))
            self._buf = self._buf[9 + length:]
        return frames


def _tcp_queues(local_port, remote_port):
    """(tx_queue, rx_queue) of the loopback IPv4 socket local_port ->
    remote_port from /proc/net/tcp, or None when it is not listed."""
    want = ("0100007F:%04X" % local_port, "0100007F:%04X" % remote_port)
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if (fields[1], fields[2]) == want:
                    tx, rx = fields[4].split(":")
                    return int(tx, 16), int(rx, 16)
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    return None


class ResetProxy:
    """A loopback TCP proxy to `upstream` (host, port). Each of the first
    `resets` connections is cut mid-call; later connections are forwarded
    untouched. One thread per connection.

    The cut comes once `reset_after_bytes` bytes have gone from the client to
    the server on the connection and, when reset_after_result_bytes > 0, the
    payloads of the server's HTTP/2 DATA frames forwarded to the client (its
    responses: result blocks) reached reset_after_result_bytes, at the end of
    the frame that reached it. Then the proxy forwards nothing more either way
    and waits until the client process has read every byte forwarded (its
    socket's receive queue and the proxy's send queue empty, from
    /proc/net/tcp) plus CUT_GRACE_S for its gRPC library to hand the complete
    result blocks to the application, and only then cuts: RST to the server,
    FIN to the client. So the client has always received part of the result
    when the connection ends, and must resume (a cut right after forwarding
    made the library discard messages it held but had not delivered yet, and
    whether a resume happened depended on timing).

    With reset_after_result_messages > 0 instead, the cut comes right after
    that many response messages (StreamAccepted, then result blocks) went to
    the client, at the exact message boundary (Http2MessageCutter), whatever
    went the other way; the same wait precedes it.

    With rst_streams > 0 the proxy resets streams instead of connections, as
    an HTTP/2 transport does (an RST_STREAM from a proxy or a load balancer,
    or gRPC's memory quota): it forwards both directions in whole frames, and
    each of the first `rst_streams` streams (over all its connections) whose
    DATA payloads forwarded to the client reach rst_after_result_bytes is cut
    at the end of the frame that reached it. Then the proxy sends the server
    RST_STREAM CANCEL for the stream, waits (forwarding nothing) until the
    client has read everything it was sent, as above, and sends the client
    RST_STREAM with `rst_error` (PROTOCOL_ERROR: the client's gRPC reports
    INTERNAL "Received RST_STREAM with error code 1"; ENHANCE_YOUR_CALM, 11:
    RESOURCE_EXHAUSTED). The stream's later DATA frames are dropped, each
    answered to the server with a connection WINDOW_UPDATE for its length so
    that the connection's window is not lost; its other frames (trailers)
    still go to the client after the RST_STREAM, which decodes and discards
    them, so that the two HPACK tables stay in step. The connection lives
    on: the client's retry may use it."""

    CUT_GRACE_S = 0.3
    DRAIN_LIMIT_S = 10.0

    def __init__(self, upstream, reset_after_bytes, resets, reset_after_result_bytes=0,
                 reset_after_result_messages=0, rst_after_result_bytes=0, rst_streams=0,
                 rst_error=PROTOCOL_ERROR):
        self.upstream = upstream
        self.rst_after_result_bytes = int(rst_after_result_bytes)
        self.rst_streams = int(rst_streams)
        self.rst_error = int(rst_error)
        self.stream_resets_done = 0
        # The result (DATA payload) bytes each reset stream had forwarded.
        self.forwarded_at_rst = []
        self.reset_after_bytes = int(reset_after_bytes)
        self.reset_after_result_bytes = int(reset_after_result_bytes)
        self.reset_after_result_messages = int(reset_after_result_messages)
        self.resets = int(resets)
        self.connections = 0
        self.resets_done = 0
        # What each cut connection had forwarded to the client: result (DATA
        # payload) bytes, or with reset_after_result_messages, messages.
        self.forwarded_at_cut = []
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                index = self.connections
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, index), daemon=True).start()

    @staticmethod
    def _reset(*socks):
        for s in socks:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            s.close()

    def _await_client_read(self, client):
        """Waits until the client process has read everything forwarded to
        it, then CUT_GRACE_S more (at most DRAIN_LIMIT_S in all)."""
        try:
            proxy_port = client.getsockname()[1]
            client_port = client.getpeername()[1]
        except OSError:
            return
        deadline = time.monotonic() + self.DRAIN_LIMIT_S
        while time.monotonic() < deadline and not self.closed:
            ours = _tcp_queues(proxy_port, client_port)
            theirs = _tcp_queues(client_port, proxy_port)
            if ours is None or theirs is None:
                time.sleep(1.0)  # Not listed (no /proc?): a fixed wait instead.
                break
            if ours[0] == 0 and theirs[1] == 0:
                break
            time.sleep(0.01)
        time.sleep(self.CUT_GRACE_S)

    def _cut(self, client, server, forwarded):
        """Ends a connection mid-call once the client has read what it was
        sent: RST to the server; to the client a FIN (an RST could make its
        kernel drop bytes it has not read), then the socket is drained briefly
        and closed."""
        self._await_client_read(client)
        with self.lock:
            self.resets_done += 1
            self.forwarded_at_cut.append(forwarded)
        self._reset(server)
        try:
            client.shutdown(socket.SHUT_WR)
            client.settimeout(0.5)
            while client.recv(1 << 16):
                pass
        except OSError:
            pass
        client.close()

    def _pump(self, client, index):
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            self._reset(client)
            return
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.rst_streams > 0:
            self._pump_frames(client, server)
            return
        cutting = index < self.resets
        limit = self.reset_after_bytes
        results = Http2DataCounter(self.reset_after_result_bytes)
        messages = Http2MessageCutter(self.reset_after_result_messages) \
            if cutting and self.reset_after_result_messages > 0 else None
        sent = 0
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, server)
        sel.register(server, selectors.EVENT_READ, client)
        try:
            while not self.closed:
                for key, _ in sel.select(timeout=0.5):
                    source, sink = key.fileobj, key.data
                    data = source.recv(1 << 16)
                    if not data:
                        return
                    if not cutting:
                        sink.sendall(data)
                        continue
                    if messages is not None:
                        if source is server:
                            data, reached = messages.feed(data)
                            if reached:
                                sink.sendall(data)
                                self._cut(client, server, messages.count)
                                client = server = None
                                return
                        sink.sendall(data)
                        continue
                    if source is server:
                        # The frame in which the results reach their
                        # threshold ends the forwarding when enough was sent.
                        end = results.feed(data)
                        if end is not None and sent >= limit:
                            sink.sendall(data[:end])
                            self._cut(client, server, results.data_bytes)
                            client = server = None
                            return
                    else:
                        if sent + len(data) >= limit and results.reached:
                            sink.sendall(data[:max(0, limit - sent)])
                            self._cut(client, server, results.data_bytes)
                            client = server = None
                            return
                        sent += len(data)
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            sel.close()
            for s in (client, server):
                if s is not None:
                    s.close()

    def _claim_stream_reset(self, forwarded):
        """True for each of the first rst_streams streams that ask."""
        with self.lock:
            if self.stream_resets_done >= self.rst_streams:
                return False
            self.stream_resets_done += 1
            self.forwarded_at_rst.append(forwarded)
            return True

    def _pump_frames(self, client, server):
        """Forwards a connection in whole frames and resets streams (the
        class comment says how). Frames are sent whole, so that the frames
        the proxy adds go in between them."""
        from_client, from_server = Http2Frames(preface=True), Http2Frames(preface=False)
        result_bytes = {}  # stream id -> DATA payload bytes forwarded to the client
        reset = set()      # the streams cut
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ)
        sel.register(server, selectors.EVENT_READ)
        try:
            while not self.closed:
                for key, _ in sel.select(timeout=0.5):
                    source = key.fileobj
                    data = source.recv(1 << 16)
                    if not data:
                        return
                    if source is client:
                        server.sendall(b"".join(f[3] for f in from_client.feed(data)))
                        continue
                    out, credit = [], 0
                    for frame_type, stream, length, raw in from_server.feed(data):
                        if stream in reset:
                            if frame_type == Http2DataCounter.DATA:
                                credit += length  # dropped: the server gets its window back
                            else:
                                out.append(raw)
                            continue
                        out.append(raw)
                        if frame_type != Http2DataCounter.DATA or stream == 0:
                            continue
                        result_bytes[stream] = result_bytes.get(stream, 0) + length
                        if result_bytes[stream] >= self.rst_after_result_bytes and \
                                self._claim_stream_reset(result_bytes[stream]):
                            client.sendall(b"".join(out))
                            out = []
                            reset.add(stream)
                            server.sendall(http2_frame(RST_STREAM, 0, stream,
                                                       CANCEL.to_bytes(4, "big")))
                            self._await_client_read(client)
                            client.sendall(http2_frame(RST_STREAM, 0, stream,
                                                       self.rst_error.to_bytes(4, "big")))
                    client.sendall(b"".join(out))
                    if credit:
                        server.sendall(http2_frame(WINDOW_UPDATE, 0, 0, credit.to_bytes(4, "big")))
        except OSError:
            pass
        finally:
            sel.close()
            client.close()
            server.close()

    def close(self):
        self.closed = True
        self.listener.close()


def run_case(case_path, runner, server_binary, timeout):
    """Runs one case; returns (case, result dict or None, problems list)."""
    with open(case_path) as f:
        case = json.load(f)
    server_spec = case.get("server") or {}
    servers, proxies = [], []
    problems = []
    result = None
    try:
        for _ in range(int(server_spec.get("replicas", 1))):
            servers.append(Server(server_binary, list(server_spec.get("flags", []))))
        ports = [s.port for s in servers]
        inject = case.get("inject")
        want_stripes = case["expect"].get("stripes") or 0
        if inject or want_stripes > 1:
            # A striped case goes through counting proxies too: K parts must
            # arrive on at least K separate connections.
            after, resets, results, messages = (0, 0, 0, 0)
            rst_after, rst_streams, rst_error = (0, 0, PROTOCOL_ERROR)
            if inject:
                after, resets = inject.get("reset_after_bytes", 0), inject.get("resets", 0)
                results = inject.get("reset_after_result_bytes", 0)
                messages = inject.get("reset_after_result_messages", 0)
                rst_after = inject.get("rst_stream_after_result_bytes", 0)
                rst_streams = inject.get("rst_streams", 0)
                rst_error = inject.get("rst_stream_error", PROTOCOL_ERROR)
            proxies = [ResetProxy(("127.0.0.1", p), after, resets, results, messages,
                                  rst_after, rst_streams, rst_error) for p in ports]
            ports = [p.port for p in proxies]
        if len(ports) == 1:
            target = "127.0.0.1:%d" % ports[0]
        else:
            target = "ipv4:" + ",".join("127.0.0.1:%d" % p for p in ports)
        command = runner + ["--case", case_path, "--target", target]
        start = time.monotonic()
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            problems.append("runner took over %d s" % timeout)
            return case, None, problems, float(timeout)
        elapsed = time.monotonic() - start
        lines = [line for line in run.stdout.splitlines() if line.strip().startswith("{")]
        if run.returncode != 0 or len(lines) != 1:
            problems.append("runner exit %d, %d JSON lines; stderr: %s"
                            % (run.returncode, len(lines), run.stderr.strip()[-800:]))
            return case, None, problems, elapsed
        result = json.loads(lines[0])
        problems += compare(case, result)
        if problems and run.stderr.strip():
            problems.append("runner stderr: " + run.stderr.strip()[-800:])
        cuts = sum(p.resets_done for p in proxies)
        if inject and result.get("status") == "OK" and \
                cuts != int(inject.get("resets", 0)) * len(proxies):
            problems.append("the proxies cut %d connection(s), the case asks for %d each: the case "
                            "did not test what it says" % (cuts, int(inject.get("resets", 0))))
        stream_cuts = sum(p.stream_resets_done for p in proxies)
        if inject and result.get("status") == "OK" and \
                stream_cuts != int(inject.get("rst_streams", 0)) * len(proxies):
            problems.append("the proxies reset %d stream(s), the case asks for %d each: the case "
                            "did not test what it says" % (stream_cuts,
                                                           int(inject.get("rst_streams", 0))))
        if case["expect"].get("placed_once") and result.get("placed_once") is False:
            problems.append("a result line arrived more than once (placed_once false)")
        connections = sum(p.connections for p in proxies)
        if want_stripes > 1 and result.get("status") == "OK" and connections < want_stripes:
            problems.append("%d parts came over %d connection(s); each part needs its own"
                            % (want_stripes, connections))
        if len(servers) > 1 and result.get("status") == "OK":
            idle = [i for i, p in enumerate(proxies) if p.connections == 0] if proxies else []
            if idle:
                problems.append("replica(s) %s got no connection: round_robin not used" % idle)
        if case["expect"].get("min_resumed") is not None and \
                not (result.get("resumed") or 0) >= case["expect"]["min_resumed"]:
            problems.append("resumed %s, expected >= %s (the retry resent received lines?)"
                            % (result["resumed"], case["expect"]["min_resumed"]))
        return case, result, problems, elapsed
    finally:
        if problems:  # What the servers said, for the table's failure lines.
            for i, s in enumerate(servers):
                tail = s.log().strip().splitlines()[-8:]
                problems.extend("server %d log: %s" % (i, line) for line in tail)
        for p in proxies:
            p.close()
        for s in servers:
            s.stop()


def compare(case, result):
    """The mismatches between a runner's JSON line and the case's `expect`."""
    expect = case["expect"]
    problems = []
    if result.get("name") != case["name"]:
        problems.append("name %r, expected %r" % (result.get("name"), case["name"]))
    if result.get("status") != expect["status"]:
        problems.append("status %s, expected %s (%s)"
                        % (result.get("status"), expect["status"], result.get("message", "")))
    if expect.get("mode") is not None and result.get("mode") != expect["mode"]:
        problems.append("mode %s, expected %s" % (result.get("mode"), expect["mode"]))
    if expect.get("stripes") is not None and result.get("stripes") != expect["stripes"]:
        problems.append("stripes %s, expected %s" % (result.get("stripes"), expect["stripes"]))
    if expect.get("min_attempts") is not None and \
            not (result.get("attempts") or 0) >= expect["min_attempts"]:
        problems.append("attempts %s, expected >= %s"
                        % (result.get("attempts"), expect["min_attempts"]))
    if expect.get("max_attempts") is not None and \
            not (result.get("attempts") or 0) <= expect["max_attempts"]:
        problems.append("attempts %s, expected <= %s"
                        % (result.get("attempts"), expect["max_attempts"]))
    # C's dtype (NumPy's result_type of dtype and diagonal_dtype): a runner that
    # sent the diagonal in A's dtype gets A's here.
    if expect.get("result_dtype") is not None and \
            result.get("result_dtype") != expect["result_dtype"]:
        problems.append("result_dtype %s, expected %s (C is NumPy's result_type of dtype %s and "
                        "diagonal_dtype %s)" % (result.get("result_dtype"), expect["result_dtype"],
                                                case.get("dtype"),
                                                case.get("diagonal_dtype") or case.get("dtype")))
    if expect["status"] == "OK" and result.get("checked") is not True:
        problems.append("result not checked against the reference (checked=%s, max_abs_err=%s)"
                        % (result.get("checked"), result.get("max_abs_err")))
    return problems


# npm output that means "no registry", which skips rather than fails the suite.
SKIP = 77


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runner", required=True, help="the runner command line")
    parser.add_argument("--server", required=True, help="the dgmm-server binary")
    parser.add_argument("--cases", default=os.path.join(HERE, "cases"))
    parser.add_argument("--vectors", default=os.path.join(HERE, "policy_vectors.json"))
    parser.add_argument("--name", default="", help="the runner's language, for the table")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per runner call")
    parser.add_argument("--verbose", action="store_true", help="print each runner's JSON line")
    parser.add_argument("--skip-unless-python-deps", action="store_true",
                        help="exit 77 when this interpreter lacks grpcio, protobuf or numpy")
    args = parser.parse_args()
    runner = shlex.split(args.runner)
    if args.skip_unless_python_deps:
        try:
            import grpc  # noqa: F401
            import google.protobuf  # noqa: F401
            import numpy  # noqa: F401
        except ImportError as missing:
            print("SKIP: %s lacks a Python client dependency (%s)" % (sys.executable, missing))
            return SKIP
    failures = 0
    start = time.monotonic()

    vec = subprocess.run(runner + ["--vectors", args.vectors], capture_output=True, text=True,
                         timeout=args.timeout)
    vec_lines = [line for line in vec.stdout.splitlines() if line.strip().startswith("{")]
    try:
        vec_result = json.loads(vec_lines[-1])
    except (IndexError, ValueError):
        vec_result = None
    if vec.returncode != 0 or not vec_result or vec_result.get("failed") or \
            not vec_result.get("vectors"):
        failures += 1
        print("FAIL policy vectors: exit %d, %s %s" % (vec.returncode, vec.stdout.strip()[-1500:],
                                                      vec.stderr.strip()[-1500:]))
    else:
        print("ok   policy vectors: %d checked" % vec_result["vectors"])

    cases = sorted(os.path.join(args.cases, n) for n in os.listdir(args.cases)
                   if n.endswith(".json"))
    if args.only:
        cases = [c for c in cases if args.only in os.path.basename(c)]
    header = "%-4s %-38s %-18s %-6s %-7s %-8s %-10s %s" % (
        "", "case (%s)" % args.name if args.name else "case", "status", "mode", "stripes",
        "attempts", "max_err", "time")
    print(header)
    for path in cases:
        try:
            case, result, problems, elapsed = run_case(path, runner, args.server, args.timeout)
        except Exception as e:  # A server that would not start: a failure of the suite.
            case, result, problems, elapsed = {"name": os.path.basename(path)}, None, [repr(e)], 0
        result = result or {}
        ok = not problems
        failures += 0 if ok else 1
        print("%-4s %-38s %-18s %-6s %-7s %-8s %-10s %.2fs" % (
            "ok" if ok else "FAIL", case["name"], result.get("status", "-"),
            result.get("mode", "-"), result.get("stripes", "-"), result.get("attempts", "-"),
            "%.1e" % result["max_abs_err"] if isinstance(result.get("max_abs_err"), (int, float))
            else "-", elapsed))
        for p in problems:
            print("       " + p)
        if args.verbose and result:
            print("       " + json.dumps(result))
    print("%s: %d cases, %d vector sets, %d failed, %.1f s"
          % (args.name or "conformance", len(cases), 1, failures, time.monotonic() - start))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
