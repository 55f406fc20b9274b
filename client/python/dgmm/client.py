"""dgmm.Client: NumPy arrays in, NumPy arrays out, over gRPC."""

import random
import threading
import time

import grpc
import numpy as np

from . import _health
from .v1 import dgmm_pb2 as pb
from .v1 import dgmm_pb2_grpc as pb_grpc
from .regions import RegionMethods

_MIB = 1 << 20
# Used when the caller does not set them and the server's GetServerInfo cannot
# be reached for its own limits: gRPC's default message limit and the
# server's default block size.
DEFAULT_UNARY_LIMIT_BYTES = 4 * _MIB
DEFAULT_BLOCK_BYTES = 4 * _MIB
# Room for the header fields around the payloads in a MultiplyRequest.
_REQUEST_OVERHEAD_BYTES = 1024

_SIDES = {"right": pb.SIDE_RIGHT, "left": pb.SIDE_LEFT}
_BACKENDS = {
    "auto": pb.BACKEND_AUTO,
    "cpu": pb.BACKEND_CPU,
    "cuda": pb.BACKEND_CUDA_KERNEL,
    "cuda_kernel": pb.BACKEND_CUDA_KERNEL,
    "cublas": pb.BACKEND_CUBLAS,
}
_WIRE_DTYPES = {4: (np.dtype("<f4"), pb.DTYPE_FLOAT32), 8: (np.dtype("<f8"), pb.DTYPE_FLOAT64)}


class DgmmError(Exception):
    """A dgmm call ended with a gRPC status other than OK.

    Attributes:
      code: the grpc.StatusCode (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...).
      details: the server's message, which says what was wrong and what to do.
      trailing_metadata: the call's trailing metadata as (key, value) pairs.
    """

    def __init__(self, code, details, trailing_metadata=()):
        super().__init__("%s: %s" % (code.name, details))
        self.code = code
        self.details = details
        self.trailing_metadata = tuple(trailing_metadata or ())

    @property
    def retry_after_ms(self):
        """The server's `grpc-retry-pushback-ms` hint (queue full), or None."""
        for key, value in self.trailing_metadata:
            if key == "grpc-retry-pushback-ms":
                try:
                    return int(value)
                except ValueError:
                    return None
        return None

    @classmethod
    def from_rpc_error(cls, error):
        code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
        details = error.details() if callable(getattr(error, "details", None)) else str(error)
        trailing = None
        if callable(getattr(error, "trailing_metadata", None)):
            trailing = error.trailing_metadata()
        return cls(code, details or "", trailing)


class RetryPolicy:
    """Which failed jobs are tried again, how often and after how long.

    The same policy as the C++ client (dgmm::RetryPolicy). A job is retried
    after UNAVAILABLE (nothing listening, the connection lost, a server
    draining), after a jittered exponential backoff; and after
    RESOURCE_EXHAUSTED that carries the `grpc-retry-pushback-ms` trailer (the
    admission queue was full), after the time it names. Other errors are
    final, and so is any error of a streamed job once a result block has
    arrived. No wait may end past the job's deadline (multiply's timeout).

    The first attempt fails fast when there is no connection. A retried
    attempt first waits for the channel to connect, up to the deadline and at
    most max_reconnect_wait seconds (no connection by then ends the job with
    UNAVAILABLE), and is then sent with wait_for_ready.

    Args (times in seconds):
      max_attempts: attempts per job, the first included; 1 turns retries off.
      initial_backoff: the wait before the second attempt after UNAVAILABLE;
        each later one is backoff_multiplier times longer, up to max_backoff,
        and every wait is jittered by +-20%.
      max_reconnect_wait: how long a retried attempt waits for a connection.
    """

    JITTER_FRACTION = 0.2

    def __init__(self, max_attempts=4, initial_backoff=0.1, max_backoff=2.0,
                 backoff_multiplier=2.0, max_reconnect_wait=5.0):
        if (max_attempts < 1 or not initial_backoff > 0 or max_backoff < initial_backoff
                or not backoff_multiplier >= 1 or not max_reconnect_wait > 0):
            raise ValueError("dgmm.RetryPolicy: max_attempts must be >= 1, initial_backoff > 0, "
                             "max_backoff >= initial_backoff, backoff_multiplier >= 1 and "
                             "max_reconnect_wait > 0")
        self.max_attempts = int(max_attempts)
        self.initial_backoff = float(initial_backoff)
        self.max_backoff = float(max_backoff)
        self.backoff_multiplier = float(backoff_multiplier)
        self.max_reconnect_wait = float(max_reconnect_wait)

    def delay(self, attempts_made, code, pushback_ms, now, deadline, jitter):
        """Seconds to wait before attempt attempts_made + 1 of a job whose
        attempt attempts_made (1-based) failed with grpc.StatusCode `code`, or
        None when it must not be retried. pushback_ms: the failed call's
        grpc-retry-pushback-ms (None if absent); now and deadline (None: no
        deadline) in time.monotonic() seconds; jitter in [-1, 1]."""
        if attempts_made >= self.max_attempts:
            return None
        if code == grpc.StatusCode.UNAVAILABLE:
            base = min(self.initial_backoff * self.backoff_multiplier ** (attempts_made - 1),
                       self.max_backoff)
            wait = base * (1 + self.JITTER_FRACTION * max(-1.0, min(1.0, jitter)))
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and pushback_ms is not None:
            # Without the trailer the job itself is too large: retrying cannot help.
            wait = pushback_ms / 1000.0
        else:
            return None
        if deadline is not None and now + wait >= deadline:
            return None
        return wait


class _FinalError(Exception):
    """An attempt's DgmmError that must not be retried."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def _protocol_error(message):
    return DgmmError(grpc.StatusCode.INTERNAL, "dgmm client: server broke the protocol: " + message)


class _Job:
    """A validated request: the matrix as a flat wire-order view, and the header."""

    def __init__(self, a, d, side, backend):
        a = np.asarray(a)
        if a.ndim != 2:
            raise ValueError("dgmm: A must be a 2-D matrix, got an array of shape %s" % (a.shape,))
        if a.dtype.kind != "f" or a.dtype.itemsize not in _WIRE_DTYPES:
            raise ValueError("dgmm: A must be float32 or float64, got %s; convert it first, "
                             "e.g. A.astype(numpy.float64)" % a.dtype)
        self.wire_dtype, dtype_enum = _WIRE_DTYPES[a.dtype.itemsize]
        if a.flags.c_contiguous:
            self.col_major = False
        elif a.flags.f_contiguous:
            self.col_major = True
        else:
            a = np.ascontiguousarray(a)
            self.col_major = False
        a = a.astype(self.wire_dtype, copy=False)  # Only copies non-little-endian input.
        self.order = "F" if self.col_major else "C"
        self.rows, self.cols = a.shape
        self.flat = a.reshape(-1, order=self.order)  # A view: `a` is contiguous in `order`.

        d = np.asarray(d)
        if d.ndim != 1:
            raise ValueError("dgmm: the diagonal must be a 1-D array, got shape %s" % (d.shape,))
        if d.dtype.kind not in "biuf":
            raise ValueError("dgmm: the diagonal must be real numbers, got %s" % d.dtype)
        diagonal = np.ascontiguousarray(d, dtype=self.wire_dtype)

        self.header = pb.JobHeader(
            rows=self.rows, cols=self.cols, dtype=dtype_enum,
            layout=pb.LAYOUT_COL_MAJOR if self.col_major else pb.LAYOUT_ROW_MAJOR,
            side=_enum_value(side, _SIDES, "side"),
            backend=_enum_value(backend, _BACKENDS, "backend"),
            diagonal=diagonal.tobytes())
        self.num_lines = self.cols if self.col_major else self.rows
        self.line_elems = self.rows if self.col_major else self.cols
        self.line_bytes = self.line_elems * self.wire_dtype.itemsize
        self.matrix_bytes = self.flat.nbytes

    def new_output(self):
        """The result array and a flat (wire-order) view of it to fill."""
        out = np.empty((self.rows, self.cols), dtype=self.wire_dtype, order=self.order)
        return out, out.reshape(-1, order=self.order)


def _ms(seconds):
    """Seconds as a whole number of milliseconds for a channel argument."""
    return max(1, min(int(round(seconds * 1000)), 2**31 - 1))


def _remaining(deadline):
    """Seconds left until a time.monotonic() deadline (None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _enum_value(value, names, what):
    if isinstance(value, str):
        try:
            return names[value.lower()]
        except KeyError:
            raise ValueError("dgmm: unknown %s %r; expected one of %s"
                             % (what, value, ", ".join(sorted(names)))) from None
    return int(value)  # A dgmm.pb enum value, passed through.


class Client(RegionMethods):
    """A connection to a dgmm server. Thread-safe; close() it (or use `with`).

    Args:
      target: "host:port" (any gRPC target string).
      credentials: grpc.ChannelCredentials for TLS; None for plaintext. For
        mutual TLS: grpc.ssl_channel_credentials(root_ca, client_key, client_cert).
      token: bearer token for servers started with --auth_token_file; sent as
        `authorization: Bearer <token>` on every dgmm call (use TLS with it).
      options: extra gRPC channel options, as (name, value) pairs.
      unary_limit_bytes: requests up to this size go in one Multiply call,
        larger ones through MultiplyStream. Default: the server's
        max_unary_message_bytes (asked once, via GetServerInfo).
      block_bytes: largest stream block payload. Default: the server's
        max_block_bytes, at most 4 MiB.
      retry: a dgmm.RetryPolicy for multiply (default RetryPolicy(): 4
        attempts); server_info and health are not retried.
      initial_reconnect_backoff, min_reconnect_backoff, max_reconnect_backoff:
        seconds, the channel's reconnect backoff (gRPC channel args
        grpc.{initial,min,max}_reconnect_backoff_ms; gRPC's own defaults are
        1, 20 and 120 s). initial: the wait after the first failed connection
        attempt, growing 1.6x per attempt up to max (so a restarted server is
        found at most about 1.2 * max after it is up). min is, in gRPC core,
        the shortest time a connection attempt (TCP, TLS and HTTP/2
        handshakes) may take before it is abandoned: keep it above the
        slowest handshake you expect. gRPC raises each to at least 0.1 s.
        Entries in `options` override these.

    Each Client has its own connection (grpc.use_local_subchannel_pool), as a
    client in another process would, rather than sharing one with other
    Clients of the same server in this process.
    """

    def __init__(self, target, *, credentials=None, token=None, options=(),
                 unary_limit_bytes=None, block_bytes=None, retry=None,
                 initial_reconnect_backoff=0.1, min_reconnect_backoff=2.0,
                 max_reconnect_backoff=1.0):
        if not (0 < initial_reconnect_backoff <= max_reconnect_backoff and
                min_reconnect_backoff > 0):
            raise ValueError("dgmm.Client: reconnect backoffs must be positive and "
                             "max_reconnect_backoff >= initial_reconnect_backoff")
        self._retry = retry if retry is not None else RetryPolicy()
        channel_options = [("grpc.max_send_message_length", -1),
                           ("grpc.max_receive_message_length", -1),
                           ("grpc.use_local_subchannel_pool", 1),
                           ("grpc.initial_reconnect_backoff_ms",
                            _ms(initial_reconnect_backoff)),
                           ("grpc.min_reconnect_backoff_ms", _ms(min_reconnect_backoff)),
                           ("grpc.max_reconnect_backoff_ms", _ms(max_reconnect_backoff))]
        channel_options += list(options)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=channel_options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=channel_options)
        self._stub = pb_grpc.DgmmStub(self._channel)
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        self._health_check = self._channel.unary_unary(
            _health.CHECK_METHOD,
            request_serializer=_health.HealthCheckRequest.SerializeToString,
            response_deserializer=_health.HealthCheckResponse.FromString)
        self._unary_limit_bytes = unary_limit_bytes
        self._block_bytes = block_bytes
        self._limits_lock = threading.Lock()

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def multiply(self, a, d, side="right", backend="auto", timeout=None, *,
                 stream=None, return_stats=False):
        """Returns C = A·diag(d) (side="right") or diag(d)·A (side="left").

        A is a 2-D float32 or float64 array; C has its dtype and its layout
        (C order stays C order, Fortran order stays Fortran order; any other
        array is sent as a C-order copy). d is 1-D and is converted to A's
        dtype. backend: "auto", "cpu", "cuda_kernel" or "cublas" (a hint).
        timeout: seconds for the whole call, all attempts included; None
        for no deadline.
        stream: True/False forces MultiplyStream/Multiply; None picks by size.
        With return_stats=True, returns (C, dgmm.pb.JobStats).
        Failed attempts are retried as the client's RetryPolicy says.

        Raises ValueError for arrays dgmm cannot take, DgmmError when the
        call fails (see .code and .details).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        job = _Job(a, d, side, backend)
        if stream is None:
            request_bytes = job.matrix_bytes + len(job.header.diagonal) + _REQUEST_OVERHEAD_BYTES
            stream = request_bytes > self._limits(timeout)[0]
        attempt = self._multiply_stream if stream else self._multiply_unary
        out, stats = self._with_retries(deadline, lambda retried: attempt(job, deadline, retried))
        return (out, stats) if return_stats else out

    def _with_retries(self, deadline, attempt):
        """Runs attempt(retried) until it succeeds or the policy says stop."""
        made = 1
        while True:
            try:
                if made > 1:
                    self._await_connection(deadline)
                return attempt(made > 1)
            except _FinalError as final:
                error, retryable = final.error, False
            except DgmmError as e:
                error, retryable = e, True
            wait = None
            if retryable:
                wait = self._retry.delay(made, error.code, error.retry_after_ms, time.monotonic(),
                                         deadline, random.uniform(-1.0, 1.0))
            if wait is None:
                if made > 1:
                    raise DgmmError(error.code, "%s (after %d attempts)" % (error.details, made),
                                    error.trailing_metadata) from None
                raise error from None
            time.sleep(wait)
            made += 1

    def _await_connection(self, deadline):
        """Before a retried attempt: waits for the channel to connect, up to
        the deadline and the policy's max_reconnect_wait."""
        start = time.monotonic()
        wait = self._retry.max_reconnect_wait
        deadline_first = deadline is not None and deadline - start <= wait
        ready = grpc.channel_ready_future(self._channel)
        try:
            ready.result(timeout=max(0.0, deadline - start) if deadline_first else wait)
            return
        except grpc.FutureTimeoutError:
            ready.cancel()
        waited = time.monotonic() - start
        # UNAVAILABLE either way: the server could not be reached.
        raise _FinalError(DgmmError(
            grpc.StatusCode.UNAVAILABLE, "no connection to the server within %.3fs (%s)"
            % (waited, "the deadline" if deadline_first else "RetryPolicy.max_reconnect_wait")))

    def server_info(self, timeout=None):
        """The server's dgmm.pb.GetServerInfoResponse (devices, budgets, limits)."""
        try:
            return self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout,
                                            metadata=self._metadata)
        except grpc.RpcError as e:
            raise DgmmError.from_rpc_error(e) from None

    def health(self, service="", timeout=None):
        """The grpc.health.v1 status of `service` ("" = the whole server):
        "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN"."""
        try:
            response = self._health_check(_health.HealthCheckRequest(service=service),
                                          timeout=timeout)
        except grpc.RpcError as e:
            raise DgmmError.from_rpc_error(e) from None
        return _health.status_name(response)

    def _limits(self, timeout):
        """(unary limit, block bytes): the caller's, else the server's."""
        with self._limits_lock:
            if self._unary_limit_bytes is None or self._block_bytes is None:
                unary, block = DEFAULT_UNARY_LIMIT_BYTES, DEFAULT_BLOCK_BYTES
                try:
                    limits = self._stub.GetServerInfo(pb.GetServerInfoRequest(),
                                                      timeout=timeout,
                                                      metadata=self._metadata).limits
                    unary = limits.max_unary_message_bytes or unary
                    block = min(limits.max_block_bytes or block, DEFAULT_BLOCK_BYTES)
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                        raise DgmmError.from_rpc_error(e) from None
                if self._unary_limit_bytes is None:
                    self._unary_limit_bytes = unary
                if self._block_bytes is None:
                    self._block_bytes = block
            return self._unary_limit_bytes, self._block_bytes

    def _multiply_unary(self, job, deadline, retried):
        """One attempt; DgmmError to retry, _FinalError not to."""
        try:
            response = self._stub.Multiply(
                pb.MultiplyRequest(header=job.header, matrix=job.flat.tobytes()),
                timeout=_remaining(deadline), metadata=self._metadata,
                wait_for_ready=True if retried else None)
        except grpc.RpcError as e:
            raise DgmmError.from_rpc_error(e) from None
        if len(response.result) != job.matrix_bytes:
            raise _FinalError(_protocol_error("result has %d bytes, expected %d"
                                              % (len(response.result), job.matrix_bytes)))
        out, out_flat = job.new_output()
        out_flat[:] = np.frombuffer(response.result, dtype=job.wire_dtype)
        return out, response.stats

    def _multiply_stream(self, job, deadline, retried):
        """One attempt; DgmmError to retry (only while no result block has
        arrived), _FinalError not to."""
        block_bytes = self._limits(_remaining(deadline))[1]
        if job.line_bytes > block_bytes:
            raise ValueError(
                "dgmm: one %s of A is %d bytes, more than the largest stream block (%d bytes); "
                "send the matrix in the other layout (numpy.%s) so that lines are shorter"
                % ("column" if job.col_major else "row", job.line_bytes, block_bytes,
                   "ascontiguousarray" if job.col_major else "asfortranarray"))
        lines_per_block = block_bytes // job.line_bytes

        def requests():
            yield pb.MultiplyStreamRequest(header=job.header)
            for first in range(0, job.num_lines, lines_per_block):
                last = min(first + lines_per_block, job.num_lines)
                data = job.flat[first * job.line_elems:last * job.line_elems]
                yield pb.MultiplyStreamRequest(
                    block=pb.Block(first_line=first, data=data.tobytes()))

        out, out_flat = job.new_output()
        progress = {"lines_done": 0}
        responses = self._stub.MultiplyStream(requests(), timeout=_remaining(deadline),
                                              metadata=self._metadata,
                                              wait_for_ready=True if retried else None)
        try:
            stats = self._receive_stream(job, responses, out_flat, progress)
        except DgmmError as e:
            responses.cancel()
            raise _FinalError(e) from None
        except grpc.RpcError as e:
            error = DgmmError.from_rpc_error(e)
            # Once part of the result has been delivered the job is not repeated.
            if progress["lines_done"] > 0:
                raise _FinalError(error) from None
            raise error from None
        return out, stats

    @staticmethod
    def _receive_stream(job, responses, out_flat, progress):
        """Places result blocks into out_flat; returns the job's stats.
        progress["lines_done"] counts the result lines placed."""
        first = next(responses, None)
        if first is None or first.WhichOneof("kind") != "accepted":
            raise _protocol_error("the first message is not `accepted`")
        lines_done = 0
        stats = None
        for message in responses:
            kind = message.WhichOneof("kind")
            if kind == "block" and stats is None:
                block = message.block
                lines, remainder = divmod(len(block.data), job.line_bytes)
                if (block.first_line != lines_done or remainder or lines == 0 or
                        lines_done + lines > job.num_lines):
                    raise _protocol_error(
                        "result block at line %d with %d bytes, expected whole lines from "
                        "line %d" % (block.first_line, len(block.data), lines_done))
                begin = lines_done * job.line_elems
                end = begin + lines * job.line_elems
                out_flat[begin:end] = np.frombuffer(block.data, dtype=job.wire_dtype)
                lines_done += lines
                progress["lines_done"] = lines_done
            elif kind == "stats" and stats is None:
                stats = message.stats
            else:
                raise _protocol_error("unexpected `%s` message" % kind)
        if lines_done != job.num_lines or stats is None:
            raise _protocol_error("the call ended after %d of %d lines%s"
                                  % (lines_done, job.num_lines,
                                     "" if stats else " without stats"))
        return stats
