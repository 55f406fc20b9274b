"""dgmm.Client: NumPy arrays in, NumPy arrays out, over gRPC."""

import threading

import grpc
import numpy as np

from . import _health
from .v1 import dgmm_pb2 as pb
from .v1 import dgmm_pb2_grpc as pb_grpc

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


def _enum_value(value, names, what):
    if isinstance(value, str):
        try:
            return names[value.lower()]
        except KeyError:
            raise ValueError("dgmm: unknown %s %r; expected one of %s"
                             % (what, value, ", ".join(sorted(names)))) from None
    return int(value)  # A dgmm.pb enum value, passed through.


class Client:
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
    """

    def __init__(self, target, *, credentials=None, token=None, options=(),
                 unary_limit_bytes=None, block_bytes=None):
        channel_options = [("grpc.max_send_message_length", -1),
                           ("grpc.max_receive_message_length", -1)] + list(options)
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
        timeout: seconds for the whole call, None for no deadline.
        stream: True/False forces MultiplyStream/Multiply; None picks by size.
        With return_stats=True, returns (C, dgmm.pb.JobStats).

        Raises ValueError for arrays dgmm cannot take, DgmmError when the
        call fails (see .code and .details).
        """
        job = _Job(a, d, side, backend)
        if stream is None:
            request_bytes = job.matrix_bytes + len(job.header.diagonal) + _REQUEST_OVERHEAD_BYTES
            stream = request_bytes > self._limits(timeout)[0]
        try:
            if stream:
                out, stats = self._multiply_stream(job, timeout)
            else:
                out, stats = self._multiply_unary(job, timeout)
        except grpc.RpcError as e:
            raise DgmmError.from_rpc_error(e) from None
        return (out, stats) if return_stats else out

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

    def _multiply_unary(self, job, timeout):
        response = self._stub.Multiply(
            pb.MultiplyRequest(header=job.header, matrix=job.flat.tobytes()), timeout=timeout,
            metadata=self._metadata)
        if len(response.result) != job.matrix_bytes:
            raise _protocol_error("result has %d bytes, expected %d"
                                  % (len(response.result), job.matrix_bytes))
        out, out_flat = job.new_output()
        out_flat[:] = np.frombuffer(response.result, dtype=job.wire_dtype)
        return out, response.stats

    def _multiply_stream(self, job, timeout):
        block_bytes = self._limits(timeout)[1]
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
        responses = self._stub.MultiplyStream(requests(), timeout=timeout,
                                              metadata=self._metadata)
        try:
            stats = self._receive_stream(job, responses, out_flat)
        except DgmmError:
            responses.cancel()
            raise
        return out, stats

    @staticmethod
    def _receive_stream(job, responses, out_flat):
        """Places result blocks into out_flat; returns the job's stats."""
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
            elif kind == "stats" and stats is None:
                stats = message.stats
            else:
                raise _protocol_error("unexpected `%s` message" % kind)
        if lines_done != job.num_lines or stats is None:
            raise _protocol_error("the call ended after %d of %d lines%s"
                                  % (lines_done, job.num_lines,
                                     "" if stats else " without stats"))
        return stats
