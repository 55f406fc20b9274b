"""dgmm.local_socket: a region session on the server's local socket (
docs/protocol.md "The local socket"; the messages are LocalRequest and
LocalResponse in dgmm.proto).

The server maps only memory its client opened itself: a client on the
server's host connects to the server's Unix socket (GetServerInfo's
limits.local_socket), where the kernel tells the server the client's uid;
says hello and gets a session; passes the descriptor of its memory
(SCM_RIGHTS) for a one-time ticket; and names the ticket in RegisterRegion.
Every region RPC carries the session in the metadata `dgmm-session`. The
session, and every region registered under it, lasts while the connection
stays open.

dgmm.Client opens one LocalSession lazily, on its first region call, and
closes it in close(); dgmm.regions uses it. Most code never touches this
module; Client.local_session() returns the client's session.

Wire format: each message is a frame, its length as 4 bytes little-endian
(at most 4096), then its protobuf bytes; the client sends a LocalRequest and
reads one LocalResponse, in turn.
"""

import errno
import os
import socket
import struct
import threading

import grpc

from .client import DgmmError
from .v1 import dgmm_pb2 as pb

MAX_FRAME = 4096
# Seconds a local-socket request may take when the call has no timeout: the
# server answers at once (one poll loop, no work), so this only bounds a hang.
DEFAULT_TIMEOUT = 30.0
ENV_SOCKET = "DGMM_LOCAL_SOCKET"

_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
_HOW_TO = ("regions need a client on the server's host that can reach its local socket "
           "(in a container, mount the socket's directory and pass its path as "
           "dgmm.Client(..., local_socket=PATH) or $%s); a client elsewhere streams the "
           "job (Client.multiply)" % ENV_SOCKET)


def _error(code, message):
    return DgmmError(code, "dgmm: " + message)


class LocalSession:
    """An open session on a dgmm server's local socket.

    Attributes (from the server's LocalHelloReply): path (the socket as this
    process reached it), session (the secret sent as `dgmm-session`), uid,
    gid, pid (this process's credentials as the server's kernel saw them),
    instance_id (the server's, as GetServerInfo reports it), max_tickets,
    ticket_timeout_ms. Thread-safe: one request at a time.
    """

    def __init__(self, path, sock, hello):
        self.path = path
        self._sock = sock
        self._lock = threading.Lock()
        self._closed = False
        self.session = hello.session
        self.uid = hello.uid
        self.gid = hello.gid
        self.pid = hello.pid
        self.instance_id = hello.instance_id
        self.max_tickets = hello.max_tickets
        self.ticket_timeout_ms = hello.ticket_timeout_ms

    @classmethod
    def connect(cls, path, instance_id=None, timeout=None):
        """Connects to the socket at `path` and says hello. instance_id: the
        GetServerInfoResponse.instance_id of the server the caller talks to;
        a socket of another server is FAILED_PRECONDITION. Raises DgmmError
        (FAILED_PRECONDITION when the socket cannot be reached)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(_seconds(timeout))
            try:
                sock.connect(path)
            except OSError as e:
                raise _error(grpc.StatusCode.FAILED_PRECONDITION,
                             "cannot connect to the server's local socket %s (%s): %s"
                             % (path, os.strerror(e.errno) if e.errno else e, _HOW_TO)) from None
            reply = _exchange(sock, pb.LocalRequest(hello=pb.LocalHello()), (), path)
            if reply.code != 0:
                raise _error(_STATUS_CODES.get(reply.code, grpc.StatusCode.UNKNOWN),
                             "the local socket %s refused the hello: %s" % (path, reply.message))
            hello = reply.hello
            if not hello.session:
                raise _error(grpc.StatusCode.INTERNAL,
                             "the local socket %s answered the hello without a session" % path)
            if instance_id is not None and hello.instance_id != instance_id:
                raise _error(grpc.StatusCode.FAILED_PRECONDITION,
                             "the local socket %s belongs to another dgmm server (instance %r, "
                             "not %r, the server this client calls): %s"
                             % (path, hello.instance_id, instance_id, _HOW_TO))
            sock.settimeout(None)
            return cls(path, sock, hello)
        except BaseException:
            sock.close()
            raise

    @property
    def closed(self):
        return self._closed

    def alive(self):
        """Whether the connection is still open at both ends (the server
        never writes unasked, so anything readable now is its end closing)."""
        with self._lock:
            if self._closed:
                return False
            try:
                data = self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            return bool(data)  # b"": the server closed it

    def pass_fd(self, fd, kind=pb.LOCAL_FD_KIND_MEMORY, device=0, allocation_bytes=0,
                timeout=None):
        """Passes descriptor `fd` (this process keeps its own) and returns the
        server's dgmm.pb.LocalTicket (ticket, object_bytes, sealed). Raises
        DgmmError with the server's code (INVALID_ARGUMENT for a descriptor
        that is not memory, RESOURCE_EXHAUSTED for too many unclaimed
        tickets)."""
        request = pb.LocalRequest(pass_fd=pb.LocalPassFd(kind=kind, device=device,
                                                         allocation_bytes=allocation_bytes))
        return self._ticket(self._request(request, (fd,), timeout), "passing a descriptor")

    def open_shm(self, key, timeout=None):
        """Asks the server to open POSIX shared-memory object `key` ("/name")
        itself (LocalOpenShm: only an object this uid owns and nobody else may
        write) and returns its dgmm.pb.LocalTicket. Passing the descriptor
        (pass_fd) needs no such rule; this is for clients that cannot."""
        return self._ticket(self._request(pb.LocalRequest(open_shm=pb.LocalOpenShm(key=key)), (),
                                          timeout), "opening %s" % key)

    def metadata(self, extra=None):
        """The metadata of a region RPC: `dgmm-session`, plus `extra` pairs."""
        return tuple(extra or ()) + (("dgmm-session", self.session),)

    def close(self):
        """Closes the connection: the server ends the session and drops every
        region registered under it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()

    def _ticket(self, reply, what):
        if reply.code != 0:
            raise _error(_STATUS_CODES.get(reply.code, grpc.StatusCode.UNKNOWN),
                         "%s on the local socket %s: %s" % (what, self.path, reply.message))
        return reply.ticket

    def _request(self, request, fds, timeout):
        with self._lock:
            if self._closed:
                raise _error(grpc.StatusCode.CANCELLED,
                             "the local session on %s is closed" % self.path)
            self._sock.settimeout(_seconds(timeout))
            try:
                return _exchange(self._sock, request, fds, self.path)
            except DgmmError:
                self._broken()
                raise
            finally:
                if not self._closed:
                    self._sock.settimeout(None)

    def _broken(self):
        # A request that failed half-way leaves the stream out of step: the
        # session is over (the server drops its regions when it sees the close).
        self._closed = True
        self._sock.close()

    def __repr__(self):
        return ("LocalSession(path=%r, uid=%d, pid=%d, instance_id=%r%s)"
                % (self.path, self.uid, self.pid, self.instance_id,
                   ", closed" if self._closed else ""))


def _seconds(timeout):
    return DEFAULT_TIMEOUT if timeout is None else max(0.001, float(timeout))


def _exchange(sock, request, fds, path):
    """Sends one LocalRequest (with `fds` as SCM_RIGHTS) and reads its LocalResponse."""
    body = request.SerializeToString()
    frame = struct.pack("<I", len(body)) + body
    try:
        if fds:
            sent = socket.send_fds(sock, [frame], list(fds))
            if sent < len(frame):
                sock.sendall(frame[sent:])
        else:
            sock.sendall(frame)
        header = _read(sock, 4, path)
        (length,) = struct.unpack("<I", header)
        if length > MAX_FRAME:
            raise _error(grpc.StatusCode.INTERNAL,
                         "the local socket %s sent a %d-byte frame (at most %d)"
                         % (path, length, MAX_FRAME))
        reply = pb.LocalResponse()
        reply.ParseFromString(_read(sock, length, path))
        return reply
    except socket.timeout:
        raise _error(grpc.StatusCode.DEADLINE_EXCEEDED,
                     "the local socket %s did not answer in time" % path) from None
    except OSError as e:
        if e.errno in (errno.EPIPE, errno.ECONNRESET):
            raise _closed_error(path) from None
        raise _error(grpc.StatusCode.UNAVAILABLE, "the local socket %s failed: %s"
                     % (path, os.strerror(e.errno) if e.errno else e)) from None


def _read(sock, n, path):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise _closed_error(path)
        data += chunk
    return data


def _closed_error(path):
    return _error(grpc.StatusCode.UNAVAILABLE,
                  "the server closed its local socket connection %s (it exited, restarted, "
                  "has too many local connections, or took the request as broken); the "
                  "session's regions are gone" % path)
