"""dgmm.Client: NumPy arrays in, NumPy arrays out, over gRPC.

The client follows the one client policy of docs/protocol.md section 9 (the
same in the C++, Python and Node clients, pinned by tests/conformance):
unary or stream by size, striping of large jobs over K connections, retries
and resume per part, one deadline per job, and the backend names.
"""

import os
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
# The policy's defaults (docs/protocol.md, "Client policy"): the server's
# default max_unary_message_bytes (U) and the stream chunk (C).
DEFAULT_MAX_UNARY_MESSAGE_BYTES = 16 * _MIB
DEFAULT_CHUNK_BYTES = 4 * _MIB
# Auto striping: one part per 32 MiB of matrix, at most 8 parts.
STRIPE_UNIT_BYTES = 32 * _MIB
MAX_AUTO_STRIPES = 8
# Kept for code that imported them: the old names of the two defaults.
DEFAULT_UNARY_LIMIT_BYTES = DEFAULT_MAX_UNARY_MESSAGE_BYTES
DEFAULT_BLOCK_BYTES = DEFAULT_CHUNK_BYTES

_SIDES = {"right": pb.SIDE_RIGHT, "left": pb.SIDE_LEFT}
# Policy rule 4: these names and nothing else.
BACKEND_NAMES = {
    "auto": pb.BACKEND_AUTO,
    "cpu": pb.BACKEND_CPU,
    "cuda-kernel": pb.BACKEND_CUDA_KERNEL,
    "cublas": pb.BACKEND_CUBLAS,
    "BACKEND_AUTO": pb.BACKEND_AUTO,
    "BACKEND_CPU": pb.BACKEND_CPU,
    "BACKEND_CUDA_KERNEL": pb.BACKEND_CUDA_KERNEL,
    "BACKEND_CUBLAS": pb.BACKEND_CUBLAS,
}
_WIRE_DTYPES = {4: (np.dtype("<f4"), pb.DTYPE_FLOAT32), 8: (np.dtype("<f8"), pb.DTYPE_FLOAT64)}


# ---- The policy as pure functions (checked against tests/conformance/policy_vectors.json).

def unary_threshold(max_unary_message_bytes=DEFAULT_MAX_UNARY_MESSAGE_BYTES,
                    chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Rule 1: the largest matrix + diagonal bytes sent as one Multiply:
    min(C, 7/8 of U), in integers min(C, U // 8 * 7)."""
    return min(int(chunk_bytes), int(max_unary_message_bytes) // 8 * 7)


def transfer_mode(matrix_bytes, diag_bytes, max_unary_message_bytes=DEFAULT_MAX_UNARY_MESSAGE_BYTES,
                  chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Rule 1: "unary" or "stream" for a job (or one part of a striped job)."""
    threshold = unary_threshold(max_unary_message_bytes, chunk_bytes)
    return "unary" if matrix_bytes + diag_bytes <= threshold else "stream"


def lines_per_block(line_bytes, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Rule 1: whole lines per stream block, max(1, floor(C / line_bytes))."""
    return max(1, int(chunk_bytes) // int(line_bytes))


def stripe_count(matrix_bytes, lines, stripes=None):
    """Rule 2: K, the number of parts. stripes: the caller's option (>= 1) or
    None for auto (min(8, max(1, matrix_bytes // 32 MiB))); then at most lines."""
    if stripes is None:
        k = min(MAX_AUTO_STRIPES, max(1, int(matrix_bytes) // STRIPE_UNIT_BYTES))
    else:
        if isinstance(stripes, bool) or int(stripes) != stripes or stripes < 1:
            raise InvalidArgumentError("dgmm: stripes must be an integer >= 1 or None (auto), "
                                       "got %r" % (stripes,))
        k = int(stripes)
    return max(1, min(k, int(lines)))


def stripe_ranges(lines, k):
    """Rule 2: K contiguous (first_line, count) ranges covering `lines`; the
    first lines % K ranges get one extra line."""
    base, extra = divmod(int(lines), int(k))
    ranges, first = [], 0
    for i in range(k):
        count = base + (1 if i < extra else 0)
        ranges.append((first, count))
        first += count
    return ranges


def backend_value(backend):
    """Rule 4: the JobHeader.backend value of a backend name ("auto", "cpu",
    "cuda-kernel", "cublas" or an enum name such as "BACKEND_CPU"), or of a
    dgmm.pb.Backend value. Anything else raises InvalidArgumentError."""
    if isinstance(backend, str):
        if backend in BACKEND_NAMES:
            return BACKEND_NAMES[backend]
    elif isinstance(backend, int) and not isinstance(backend, bool) and \
            backend in BACKEND_NAMES.values():
        return int(backend)
    raise InvalidArgumentError(
        "dgmm: unknown backend %r; expected one of auto, cpu, cuda-kernel, cublas "
        "(or BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA_KERNEL, BACKEND_CUBLAS)" % (backend,))


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
        self.info = None  # multiply(): the failed job's MultiplyInfo.

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
    """Which failed parts of a job are tried again, how often and after how long.

    The policy of docs/protocol.md section 9, rule 3, the same in the C++ and
    Node clients. Each part of a job (the whole job when it is not striped)
    is retried by itself after UNAVAILABLE (nothing listening, the connection
    lost, a server draining), after a jittered exponential backoff; and after
    RESOURCE_EXHAUSTED that carries the `grpc-retry-pushback-ms` trailer (the
    admission queue was full), after the time it names. Other errors are
    final. A streamed part that fails after some result blocks arrived is
    resumed: the retry sends only the lines not received yet. A retry goes
    to the next of the job's channels (another connection, another replica
    under round_robin). No wait may end past the job's deadline (multiply's
    timeout), and the first final error cancels the other parts.

    The first attempt fails fast when there is no connection. A retried
    attempt first waits for its channel to connect, up to the deadline and at
    most max_reconnect_wait seconds (no connection by then ends the job with
    UNAVAILABLE), and is then sent with wait_for_ready.

    Args (times in seconds):
      max_attempts: attempts per part, the first included; 1 turns retries off.
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


class InvalidArgumentError(DgmmError, ValueError):
    """INVALID_ARGUMENT raised by the client itself, before any call (an
    unknown backend name, a bad stripes option). Also a ValueError."""

    def __init__(self, details):
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, details)


class MultiplyInfo:
    """How a multiply ran (multiply(..., return_info=True)).

    Attributes:
      mode: "unary" when every part went as one Multiply, else "stream".
      stripes: K, the number of parts (connections) the job was split into.
      attempts: attempts over all parts (K when nothing was retried).
      resumed: how many retries resumed a stream after part of its result
        had arrived (those sent only the lines still missing).
      group_id: the JobHeader.group.id of the parts, "" when K == 1.
      stats: the dgmm.pb.JobStats of each part's last attempt, in line order
        (a resumed part's stats cover only the lines of that attempt).
    """

    def __init__(self, mode, stripes, attempts, resumed, group_id, stats):
        self.mode = mode
        self.stripes = stripes
        self.attempts = attempts
        self.resumed = resumed
        self.group_id = group_id
        self.stats = stats

    def __repr__(self):
        return ("MultiplyInfo(mode=%r, stripes=%d, attempts=%d, resumed=%d, group_id=%r)"
                % (self.mode, self.stripes, self.attempts, self.resumed, self.group_id))


class _FinalError(Exception):
    """An attempt's DgmmError that must not be retried."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


class _Cancelled(Exception):
    """The job already failed (or was cancelled): this part stops quietly."""


def _protocol_error(message):
    return DgmmError(grpc.StatusCode.INTERNAL, "dgmm client: server broke the protocol: " + message)


class _Job:
    """A validated request: the matrix as a flat wire-order view, and the header."""

    def __init__(self, a, d, side, backend):
        backend = backend_value(backend)  # Rule 4 first: a bad name is refused before anything.
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
        self.diagonal = np.ascontiguousarray(d, dtype=self.wire_dtype)
        side_value = _enum_value(side, _SIDES, "side")

        self.header = pb.JobHeader(
            rows=self.rows, cols=self.cols, dtype=dtype_enum,
            layout=pb.LAYOUT_COL_MAJOR if self.col_major else pb.LAYOUT_ROW_MAJOR,
            side=side_value, backend=backend, diagonal=self.diagonal.tobytes())
        self.num_lines = self.cols if self.col_major else self.rows
        self.line_elems = self.rows if self.col_major else self.cols
        self.line_bytes = self.line_elems * self.wire_dtype.itemsize
        self.matrix_bytes = self.flat.nbytes
        # Rule 2: the diagonal runs along the split dimension (row-major LEFT,
        # column-major RIGHT): a part gets its slice, else the whole diagonal.
        left = side_value == pb.SIDE_LEFT
        self.diagonal_sliced = left != self.col_major

    def new_output(self):
        """The result array and a flat (wire-order) view of it to fill."""
        out = np.empty((self.rows, self.cols), dtype=self.wire_dtype, order=self.order)
        return out, out.reshape(-1, order=self.order)

    def check_output(self, out):
        """The caller's output array and a flat view of it, or ValueError."""
        if not isinstance(out, np.ndarray) or out.shape != (self.rows, self.cols) or \
                out.dtype != self.wire_dtype or not out.flags.writeable or \
                not out.flags[("F" if self.col_major else "C") + "_CONTIGUOUS"]:
            raise ValueError("dgmm: out must be a writable %s-order %s array of shape %s"
                             % (self.order, self.wire_dtype, (self.rows, self.cols)))
        return out, out.reshape(-1, order=self.order)

    def part_header(self, first, count, group):
        """The JobHeader of lines [first, first + count); group: a JobGroup or None."""
        header = pb.JobHeader()
        header.CopyFrom(self.header)
        if self.col_major:
            header.cols = count
        else:
            header.rows = count
        if self.diagonal_sliced:
            header.diagonal = self.diagonal[first:first + count].tobytes()
        if group is not None:
            header.group.CopyFrom(group)
        return header


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


def _new_group_id():
    """Rule 2: one random id per logical job, 16 lowercase hex characters."""
    return os.urandom(8).hex()


class Client(RegionMethods):
    """A connection to a dgmm server. Thread-safe; close() it (or use `with`).

    Args:
      target: "host:port" (any gRPC target string; "ipv4:h:p1,h:p2" or a DNS
        name with several addresses, with load_balancing_policy="round_robin",
        spreads jobs and the parts of striped jobs over every replica).
      credentials: grpc.ChannelCredentials for TLS; None for plaintext. For
        mutual TLS: grpc.ssl_channel_credentials(root_ca, client_key, client_cert).
      token: bearer token for servers started with --auth_token_file; sent as
        `authorization: Bearer <token>` on every dgmm call (use TLS with it).
      options: extra gRPC channel options, as (name, value) pairs.
      max_unary_message_bytes (U, default 16 MiB, the server's default) and
        chunk_bytes (C, default 4 MiB): a job (or one part of a striped job)
        whose matrix and diagonal bytes are at most min(C, 7/8 U) goes as one
        Multiply; a larger one through MultiplyStream in blocks of
        max(1, C // line_bytes) whole lines. Set U to the server's
        --max_unary_message_bytes when it is lower than 16 MiB.
        unary_limit_bytes and block_bytes are their former names (either
        spelling works).
      stripes: the default striping for multiply(): None (auto: one part per
        32 MiB of matrix, at most 8, so jobs under 64 MiB are not split) or K >= 1.
      retry: a dgmm.RetryPolicy for multiply (default RetryPolicy(): 4
        attempts per part); server_info and health are not retried.
      load_balancing_policy: e.g. "round_robin" (gRPC's default is pick_first).
      initial_reconnect_backoff, min_reconnect_backoff, max_reconnect_backoff:
        seconds, the channels' reconnect backoff (gRPC channel args
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
    Clients of the same server in this process. A striped job with K parts
    uses K channels, each with its own connection (channel i has the extra
    argument ("dgmm.stripe", i)); they are made when first needed and kept.
    """

    def __init__(self, target, *, credentials=None, token=None, options=(),
                 max_unary_message_bytes=None, chunk_bytes=None, stripes=None,
                 unary_limit_bytes=None, block_bytes=None, retry=None,
                 load_balancing_policy=None,
                 initial_reconnect_backoff=0.1, min_reconnect_backoff=2.0,
                 max_reconnect_backoff=1.0):
        if not (0 < initial_reconnect_backoff <= max_reconnect_backoff and
                min_reconnect_backoff > 0):
            raise ValueError("dgmm.Client: reconnect backoffs must be positive and "
                             "max_reconnect_backoff >= initial_reconnect_backoff")
        if max_unary_message_bytes is None:
            max_unary_message_bytes = unary_limit_bytes
        if chunk_bytes is None:
            chunk_bytes = block_bytes
        self._max_unary = int(max_unary_message_bytes or DEFAULT_MAX_UNARY_MESSAGE_BYTES)
        self._chunk = int(chunk_bytes or DEFAULT_CHUNK_BYTES)
        if self._max_unary < 1 or self._chunk < 1:
            raise ValueError("dgmm.Client: max_unary_message_bytes and chunk_bytes must be >= 1")
        if stripes is not None:
            stripe_count(1, 1, stripes)  # Checks the option.
        self._stripes = stripes
        self._retry = retry if retry is not None else RetryPolicy()
        channel_options = [("grpc.max_send_message_length", -1),
                           ("grpc.max_receive_message_length", -1),
                           ("grpc.use_local_subchannel_pool", 1),
                           ("grpc.initial_reconnect_backoff_ms",
                            _ms(initial_reconnect_backoff)),
                           ("grpc.min_reconnect_backoff_ms", _ms(min_reconnect_backoff)),
                           ("grpc.max_reconnect_backoff_ms", _ms(max_reconnect_backoff))]
        if load_balancing_policy:
            channel_options.append(("grpc.lb_policy_name", load_balancing_policy))
        channel_options += list(options)
        self._target = target
        self._credentials = credentials
        self._channel_options = channel_options
        self._channel = self._new_channel(channel_options)
        self._stub = pb_grpc.DgmmStub(self._channel)
        self._channels_lock = threading.Lock()
        self._stripe_channels = [(self._channel, None)]  # (channel, stub); stub None: self._stub
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        self._health_check = self._channel.unary_unary(
            _health.CHECK_METHOD,
            request_serializer=_health.HealthCheckRequest.SerializeToString,
            response_deserializer=_health.HealthCheckResponse.FromString)

    def _new_channel(self, options):
        if self._credentials is None:
            return grpc.insecure_channel(self._target, options=options)
        return grpc.secure_channel(self._target, self._credentials, options=options)

    def _channel_and_stub(self, i):
        """Channel i of the striping channels (0 is the client's own) and its stub."""
        with self._channels_lock:
            if not self._stripe_channels:  # close() emptied it: open nothing that nothing closes
                raise DgmmError(grpc.StatusCode.CANCELLED, "dgmm: the client is closed")
            while len(self._stripe_channels) <= i:
                n = len(self._stripe_channels)
                channel = self._new_channel(self._channel_options + [("dgmm.stripe", n)])
                self._stripe_channels.append((channel, pb_grpc.DgmmStub(channel)))
            channel, stub = self._stripe_channels[i]
        # Looked up at call time so that a test may wrap the client's own stub.
        return channel, (stub if stub is not None else self._stub)

    def close(self):
        with self._channels_lock:
            channels = [channel for channel, _ in self._stripe_channels]
            self._stripe_channels = []
        for channel in channels:
            channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def multiply(self, a, d, side="right", backend="auto", timeout=None, *,
                 stream=None, stripes=None, out=None, return_stats=False, return_info=False,
                 progress=None):
        """Returns C = A·diag(d) (side="right") or diag(d)·A (side="left").

        A is a 2-D float32 or float64 array; C has its dtype and its layout
        (C order stays C order, Fortran order stays Fortran order; any other
        array is sent as a C-order copy). d is 1-D and is converted to A's
        dtype. backend: "auto", "cpu", "cuda-kernel" or "cublas" (a hint;
        also the enum names "BACKEND_CPU", ... or dgmm.pb values); any other
        name raises dgmm.InvalidArgumentError (a DgmmError with code
        INVALID_ARGUMENT, and a ValueError) before any call.
        timeout: seconds for the whole job, all parts and attempts included;
        None for no deadline.
        stream: True/False forces MultiplyStream/Multiply for every part;
        None picks by size (policy rule 1).
        stripes: K, the number of parts sent at once over K connections;
        None: the client's default (auto by size). K is capped at the number
        of lines (rows of a C-order A, columns of a Fortran-order one).
        out: optional array for C (A's shape, wire dtype float32/float64 and
        layout, contiguous and writable): the result lands in it in place and
        it is returned; by default a new array.
        progress: optional callable(lines_done, total_lines), called from the
        parts' threads as result lines arrive.
        With return_stats=True, returns (C, dgmm.pb.JobStats) (for a striped
        job: byte counts summed over the parts, times the longest part's);
        with return_info=True, (C, dgmm.MultiplyInfo) (mode, stripes,
        attempts, per-part stats); with both, (C, stats, info).
        Failed parts are retried, and streamed parts resumed, as the client's
        RetryPolicy says.

        Raises ValueError for arrays dgmm cannot take, DgmmError when the
        job fails (see .code and .details; .info is the MultiplyInfo of the
        failed job, None when the client refused it before any call).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        job = _Job(a, d, side, backend)
        k = stripe_count(job.matrix_bytes, job.num_lines,
                         stripes if stripes is not None else self._stripes)
        run = _Run(self, job, deadline, k, stream, progress, out)
        out, info = run.execute()
        result = [out]
        if return_stats:
            result.append(_merged_stats(info.stats))
        if return_info:
            result.append(info)
        return tuple(result) if len(result) > 1 else out

    def _await_connection(self, channel, deadline, cancelled):
        """Before a retried attempt: waits for `channel` to connect, up to
        the deadline and the policy's max_reconnect_wait."""
        start = time.monotonic()
        wait = self._retry.max_reconnect_wait
        deadline_first = deadline is not None and deadline - start <= wait
        limit = start + (max(0.0, deadline - start) if deadline_first else wait)
        ready = grpc.channel_ready_future(channel)
        try:
            while True:
                try:
                    ready.result(timeout=min(0.05, max(0.0, limit - time.monotonic())))
                    return
                except grpc.FutureTimeoutError:
                    if cancelled.is_set():
                        raise _Cancelled() from None
                    if time.monotonic() >= limit:
                        break
        finally:
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


def _merged_stats(stats_list):
    """One JobStats for a job from its parts' stats."""
    stats_list = [s for s in stats_list if s is not None]
    if len(stats_list) == 1:
        return stats_list[0]
    merged = pb.JobStats()
    if not stats_list:
        return merged
    merged.CopyFrom(stats_list[0])
    merged.ClearField("group")
    for field in ("queue_wait_ns", "h2d_ns", "compute_ns", "d2h_ns", "total_ns"):
        setattr(merged, field, max(getattr(s, field) for s in stats_list))
    merged.bytes_in = sum(s.bytes_in for s in stats_list)
    merged.bytes_out = sum(s.bytes_out for s in stats_list)
    return merged


class _Run:
    """One logical job: its K parts, each with its retries and resumes (rule 3)."""

    def __init__(self, client, job, deadline, k, stream, progress, out):
        self.client = client
        self.job = job
        self.deadline = deadline
        self.k = k
        self.forced = None if stream is None else ("stream" if stream else "unary")
        self.progress = progress
        self.group_id = _new_group_id() if k > 1 else ""
        self.out, self.out_flat = job.new_output() if out is None else job.check_output(out)
        self.cancelled = threading.Event()
        self.lock = threading.Lock()
        self.calls = set()  # In-flight calls, cancelled when the job fails.
        self.error = None  # The job's one status: the first final error.
        self.attempts = 0
        self.resumed = 0
        self.modes = set()
        self.lines_done = 0

    def execute(self):
        ranges = stripe_ranges(self.job.num_lines, self.k)
        stats = [None] * self.k
        if self.k == 1:
            stats[0] = self.part(0, *ranges[0])
        else:
            def worker(i, first, count):
                try:
                    stats[i] = self.part(i, first, count)
                except BaseException as e:  # Never lost in a thread: it fails the job.
                    self.fail(e if isinstance(e, DgmmError) else DgmmError(
                        grpc.StatusCode.INTERNAL, "dgmm client: %r" % (e,)))
            threads = [threading.Thread(target=worker, args=(i, first, count), daemon=True)
                       for i, (first, count) in enumerate(ranges)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        mode = "unary" if self.modes == {"unary"} else "stream"
        info = MultiplyInfo(mode, self.k, self.attempts, self.resumed, self.group_id, stats)
        if self.error is not None:
            self.error.info = info
            raise self.error
        return self.out, info

    def fail(self, error):
        """The first final error becomes the job's status and cancels the other parts."""
        with self.lock:
            if self.error is not None:
                return
            self.error = error
            self.cancelled.set()
            calls = list(self.calls)
        for call in calls:
            call.cancel()

    def track(self, call):
        with self.lock:
            self.calls.add(call)
            cancelled = self.cancelled.is_set()
        if cancelled:
            call.cancel()

    def untrack(self, call):
        with self.lock:
            self.calls.discard(call)

    def add_progress(self, lines):
        with self.lock:
            self.lines_done += lines
            done = self.lines_done
        if self.progress is not None:
            self.progress(done, self.job.num_lines)

    def part(self, i, first, count):
        """Runs lines [first, first + count) to completion; returns the last
        attempt's stats, or None after a failure (self.error then says why)."""
        client, job = self.client, self.job
        made = 0
        while True:
            if self.cancelled.is_set():
                return None
            made += 1
            with self.lock:
                self.attempts += 1
            channel, stub = client._channel_and_stub((i + made - 1) % self.k)
            group = None
            if self.k > 1:
                group = pb.JobGroup(id=self.group_id, first_line=first,
                                    total_lines=job.num_lines, parts=self.k)
            received = [0]
            try:
                if made > 1:
                    client._await_connection(channel, self.deadline, self.cancelled)
                header = job.part_header(first, count, group)
                mode = self.forced or transfer_mode(
                    count * job.line_bytes, len(header.diagonal), client._max_unary, client._chunk)
                with self.lock:
                    self.modes.add(mode)
                if mode == "unary":
                    return self.unary(stub, header, first, count, made > 1)
                return self.stream(stub, header, first, count, made > 1, received)
            except _Cancelled:
                return None
            except _FinalError as final:
                error, retryable = final.error, False
            except DgmmError as e:
                error, retryable = e, True
            if self.cancelled.is_set():
                return None
            if received[0]:
                # Resume: the lines received are kept; the retry sends the rest.
                first += received[0]
                count -= received[0]
                if count == 0:
                    return None  # Every line arrived; only the stats were lost.
            wait = None
            if retryable:
                wait = client._retry.delay(made, error.code, error.retry_after_ms,
                                           time.monotonic(), self.deadline,
                                           random.uniform(-1.0, 1.0))
            if wait is None:
                if made > 1:
                    error = DgmmError(error.code, "%s (after %d attempts)" % (error.details, made),
                                      error.trailing_metadata)
                self.fail(error)
                return None
            if received[0]:
                with self.lock:
                    self.resumed += 1
            if self.cancelled.wait(wait):
                return None

    def unary(self, stub, header, first, count, retried):
        job = self.job
        begin, end = first * job.line_elems, (first + count) * job.line_elems
        request = pb.MultiplyRequest(header=header, matrix=job.flat[begin:end].tobytes())
        future = stub.Multiply.future(request, timeout=_remaining(self.deadline),
                                      metadata=self.client._metadata,
                                      wait_for_ready=True if retried else None)
        self.track(future)
        try:
            response = future.result()
        except grpc.FutureCancelledError:
            raise _Cancelled() from None
        except grpc.RpcError as e:
            if self.cancelled.is_set():
                raise _Cancelled() from None
            raise DgmmError.from_rpc_error(e) from None
        finally:
            self.untrack(future)
        expected = (end - begin) * job.wire_dtype.itemsize
        if len(response.result) != expected:
            raise _FinalError(_protocol_error("result has %d bytes, expected %d"
                                              % (len(response.result), expected)))
        self.out_flat[begin:end] = np.frombuffer(response.result, dtype=job.wire_dtype)
        self.add_progress(count)
        return response.stats

    def stream(self, stub, header, first, count, retried, received):
        """One streamed attempt of lines [first, first + count). received[0]
        counts the result lines placed, for a resume."""
        job = self.job
        per_block = lines_per_block(job.line_bytes, self.client._chunk)

        def requests():
            yield pb.MultiplyStreamRequest(header=header)
            for start in range(0, count, per_block):
                stop = min(start + per_block, count)
                data = job.flat[(first + start) * job.line_elems:(first + stop) * job.line_elems]
                yield pb.MultiplyStreamRequest(
                    block=pb.Block(first_line=start, data=data.tobytes()))

        responses = stub.MultiplyStream(requests(), timeout=_remaining(self.deadline),
                                        metadata=self.client._metadata,
                                        wait_for_ready=True if retried else None)
        self.track(responses)
        try:
            return self.receive(responses, first, count, received)
        except DgmmError as e:
            responses.cancel()
            raise _FinalError(e) from None
        except grpc.RpcError as e:
            if self.cancelled.is_set():
                raise _Cancelled() from None
            raise DgmmError.from_rpc_error(e) from None
        finally:
            self.untrack(responses)

    def receive(self, responses, first, count, received):
        """Places result blocks into the output; returns the part's stats."""
        job = self.job
        message = next(responses, None)
        if message is None or message.WhichOneof("kind") != "accepted":
            raise _protocol_error("the first message is not `accepted`")
        stats = None
        for message in responses:
            kind = message.WhichOneof("kind")
            if kind == "block" and stats is None:
                block = message.block
                lines, remainder = divmod(len(block.data), job.line_bytes)
                done = received[0]
                if (block.first_line != done or remainder or lines == 0 or
                        done + lines > count):
                    raise _protocol_error(
                        "result block at line %d with %d bytes, expected whole lines from "
                        "line %d" % (block.first_line, len(block.data), done))
                begin = (first + done) * job.line_elems
                self.out_flat[begin:begin + lines * job.line_elems] = np.frombuffer(
                    block.data, dtype=job.wire_dtype)
                received[0] = done + lines
                self.add_progress(lines)
            elif kind == "stats" and stats is None:
                stats = message.stats
            else:
                raise _protocol_error("unexpected `%s` message" % kind)
        if received[0] != count or stats is None:
            raise _protocol_error("the call ended after %d of %d lines%s"
                                  % (received[0], count, "" if stats else " without stats"))
        return stats
