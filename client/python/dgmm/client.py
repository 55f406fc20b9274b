"""dgmm.Client: NumPy (and CuPy, PyTorch, buffer-protocol) arrays in, arrays out.

A thin layer over the C++ client (dgmm::Client, client/cpp) through the
extension dgmm._core: the one implementation of the client policy of
docs/protocol.md section 9 (unary or stream by size, striping of large jobs
over K connections, retries and resume per part, one deadline per job)
comes from dgmm::Client::Plan and its job runner. This module checks the
arrays (the same errors as before), hands their memory to the job in place
(the buffer protocol: no copy of A, the result written straight into the
output array) and turns the outcome into Python objects. Jobs run without
the GIL; Ctrl-C cancels a running job.
"""

import os
import threading

import grpc
import numpy as np

from . import _core
from . import _health
from .v1 import dgmm_pb2 as pb

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
# The element types a job takes (docs/dtypes.md), by little-endian NumPy
# dtype; bfloat16 is ml_dtypes.bfloat16, where ml_dtypes is importable.
_WIRE_DTYPES = {
    np.dtype("<f2"): pb.DTYPE_FLOAT16,
    np.dtype("<f4"): pb.DTYPE_FLOAT32,
    np.dtype("<f8"): pb.DTYPE_FLOAT64,
    np.dtype("<c8"): pb.DTYPE_COMPLEX64,
    np.dtype("<c16"): pb.DTYPE_COMPLEX128,
}
try:
    import ml_dtypes as _ml_dtypes  # noqa: E402
    _BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
    _WIRE_DTYPES[_BFLOAT16] = pb.DTYPE_BFLOAT16
except ImportError:  # bfloat16 needs ml_dtypes
    _BFLOAT16 = None

_DTYPE_OF = {enum: dtype for dtype, enum in _WIRE_DTYPES.items()}
_COMPLEX = (pb.DTYPE_COMPLEX64, pb.DTYPE_COMPLEX128)
# The width of each element type's real part: 0 half, 1 float32, 2 float64.
_REAL_RANK = {pb.DTYPE_FLOAT16: 0, pb.DTYPE_BFLOAT16: 0, pb.DTYPE_FLOAT32: 1,
              pb.DTYPE_COMPLEX64: 1, pb.DTYPE_FLOAT64: 2, pb.DTYPE_COMPLEX128: 2}


def _promote(a, b):
    """NumPy's result_type of two element types (dgmm.pb DType values), as
    the server computes it (docs/protocol.md "Element types"): float16 with
    bfloat16 gives float32, as ml_dtypes does; real with complex the complex
    type wide enough for both."""
    if a == b:
        return a
    rank = max(_REAL_RANK[a], _REAL_RANK[b], 1)
    if a in _COMPLEX or b in _COMPLEX:
        return pb.DTYPE_COMPLEX64 if rank == 1 else pb.DTYPE_COMPLEX128
    return pb.DTYPE_FLOAT32 if rank == 1 else pb.DTYPE_FLOAT64


def result_dtype(a_dtype, d_dtype):
    """The dtype of C for a matrix of `a_dtype` and diagonals of `d_dtype`
    (NumPy dtypes of the element types dgmm takes): NumPy's
    result_type(a_dtype, d_dtype) (float32 with float64 gives float64,
    float64 with complex64 gives complex128; float16 with bfloat16 gives
    float32, as ml_dtypes does). ValueError for other dtypes."""
    enums = []
    for dtype in (a_dtype, d_dtype):
        wire = _little_endian(np.dtype(dtype))
        if wire not in _WIRE_DTYPES:
            raise ValueError("dgmm: %s is not an element type dgmm takes (float16, bfloat16, "
                             "float32, float64, complex64, complex128)" % (dtype,))
        enums.append(_WIRE_DTYPES[wire])
    return _DTYPE_OF[_promote(*enums)]

# Every side multiply() takes; the region paths (dgmm.arrays, dgmm.regions)
# take one diagonal, _SIDES.
_ALL_SIDES = dict(_SIDES, both=pb.SIDE_BOTH)


def _little_endian(dtype):
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def _for_buffer(array):
    """`array` as the C++ client reads it: bfloat16 (a NumPy user dtype that
    the buffer protocol cannot name) as its 16-bit patterns."""
    if _BFLOAT16 is not None and array.dtype == _BFLOAT16:
        return array.view(np.uint16)
    return array
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
_HEALTH_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


# ---- The policy as pure functions: the C++ client's (dgmm::ChooseTransferMode,
# ChooseStripes, SplitLines), checked against tests/conformance/policy_vectors.json.

def unary_threshold(max_unary_message_bytes=DEFAULT_MAX_UNARY_MESSAGE_BYTES,
                    chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Rule 1: the largest matrix + diagonal bytes sent as one Multiply:
    min(C, 7/8 of U), in integers min(C, U // 8 * 7)."""
    return min(int(chunk_bytes), int(max_unary_message_bytes) // 8 * 7)


def transfer_mode(matrix_bytes, diag_bytes, max_unary_message_bytes=DEFAULT_MAX_UNARY_MESSAGE_BYTES,
                  chunk_bytes=DEFAULT_CHUNK_BYTES, line_bytes=0):
    """Rule 1: "unary" or "stream" for a job (or one part of a striped job);
    a job whose one line (line_bytes; 0: unknown) is longer than C goes unary
    up to U - 64 KiB."""
    return _core.choose_transfer_mode(int(matrix_bytes) + int(diag_bytes),
                                      int(max_unary_message_bytes), int(chunk_bytes),
                                      int(line_bytes))


def lines_per_block(line_bytes, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Rule 1: whole lines per stream block, max(1, floor(C / line_bytes))."""
    return max(1, int(chunk_bytes) // int(line_bytes))


def _check_stripes(stripes):
    if isinstance(stripes, bool) or not isinstance(stripes, (int, np.integer)) or stripes < 1 \
            or stripes > 256:
        raise InvalidArgumentError("dgmm: stripes must be an integer from 1 to 256 or None "
                                   "(auto), got %r" % (stripes,))
    return int(stripes)


def stripe_count(matrix_bytes, lines, stripes=None):
    """Rule 2: K, the number of parts. stripes: the caller's option (>= 1) or
    None for auto (min(8, max(1, matrix_bytes // 32 MiB))); then at most lines."""
    option = 0 if stripes is None else _check_stripes(stripes)
    return _core.choose_stripes(int(matrix_bytes), int(lines), option)


def stripe_ranges(lines, k):
    """Rule 2: K contiguous (first_line, count) ranges covering `lines`; the
    first lines % K ranges get one extra line."""
    return _core.split_lines(int(lines), int(k))


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
    Node clients (the binding runs the C++ client's; delay() states it in
    Python). A dgmm server marks every error status it makes with the
    trailer `dgmm-origin: server`; a status without it comes from gRPC or
    the network. Each part of a job (the whole job when it is not striped)
    is retried by itself after UNAVAILABLE (nothing listening, the connection
    lost, a server draining), after a jittered exponential backoff; after
    INTERNAL, UNKNOWN or RESOURCE_EXHAUSTED without `dgmm-origin: server` (a
    stream reset by the transport, "Received RST_STREAM with error code 1";
    gRPC's transport memory quota; a broken proxy), after the same backoff;
    and after RESOURCE_EXHAUSTED that carries the `grpc-retry-pushback-ms`
    trailer (the admission queue was full), after the time it names. Other
    errors are final: dgmm's own INTERNAL and RESOURCE_EXHAUSTED without a
    pushback, CANCELLED, DEADLINE_EXCEEDED, every verdict on the request. A
    streamed part that fails with a retried error after some result blocks
    arrived is resumed: the retry sends only the lines not received yet. A
    retry goes to the next of the job's channels (another connection,
    another replica under round_robin). No wait may end past the job's
    deadline (multiply's timeout), and the first final error cancels the
    other parts.

    Every attempt fails fast when there is no connection. A retried attempt
    first waits for its channel to connect, up to the deadline and at most
    max_reconnect_wait seconds (no connection by then ends the job with
    UNAVAILABLE), and is then sent without wait_for_ready too: a connection
    lost after that wait (a server that exits at the end of its drain) fails
    the attempt at once instead of holding it until the deadline.

    Args (times in seconds):
      max_attempts: attempts per part, the first included; 1 turns retries off.
      initial_backoff: the wait before the second attempt after UNAVAILABLE
        (or a transport failure);
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

    def delay(self, attempts_made, code, pushback_ms, now, deadline, jitter, from_server=True):
        """Rule 3: seconds to wait before attempt attempts_made + 1 of a job
        whose attempt attempts_made (1-based) failed with grpc.StatusCode
        `code`, or None when it must not be retried. pushback_ms: the failed
        call's grpc-retry-pushback-ms (None if absent); now and deadline
        (None: no deadline) in time.monotonic() seconds; jitter in [-1, 1];
        from_server: whether the status carried `dgmm-origin: server`."""
        if attempts_made >= self.max_attempts:
            return None
        transport_codes = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                           grpc.StatusCode.RESOURCE_EXHAUSTED)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and pushback_ms is not None:
            wait = pushback_ms / 1000.0  # The server's queue was full.
        elif code == grpc.StatusCode.UNAVAILABLE or (not from_server and code in transport_codes):
            # The transport's INTERNAL, UNKNOWN, RESOURCE_EXHAUSTED: a stream
            # reset, its memory quota, a broken proxy. The same codes from
            # dgmm (a CUDA error, a job that can never fit) are final.
            base = min(self.initial_backoff * self.backoff_multiplier ** (attempts_made - 1),
                       self.max_backoff)
            wait = base * (1 + self.JITTER_FRACTION * max(-1.0, min(1.0, jitter)))
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
      mode: "shm" when the job went through memory (the same-host path),
        "unary" when every part went as one Multiply, else "stream".
      stripes: K, the number of parts (connections) the job was split into.
      attempts: attempts over all parts (K when nothing was retried).
      resumed: how many retries resumed a stream after part of its result
        had arrived (those sent only the lines still missing).
      group_id: the JobHeader.group.id of the parts, "" when K == 1.
      stats: the dgmm.pb.JobStats of each part's last attempt, in line order
        (a resumed part's stats cover only the lines of that attempt).
      socket_reason: why a job that could have taken the same-host path
        went over the socket ("" when it took it, or was not a candidate).
      same_host: the same-host path's phases as the client saw them, in
        seconds: a dict with "setup" (session, staging region made and
        registered), "copy_in", "job" (the region job's RPC) and "copy_out";
        all zero on the socket path (the C++ client's JobResult::same_host).
      process_memory: True when the server read A from, and wrote C into,
        this process's own arrays (mode "shm" with no staging region and no
        copies: Client(process_memory=True), the default, on a server that
        granted it).
      traceparent: the W3C traceparent every call of the job carried (the
        one multiply() was given, or the one the client made for the job;
        "" for a job that failed); each part's stats name its trace_id,
        parent_span_id and the server's span_id (docs/protocol.md, "Trace
        context").
    """

    def __init__(self, mode, stripes, attempts, resumed, group_id, stats, socket_reason="",
                 same_host=None, process_memory=False, traceparent=""):
        self.mode = mode
        self.traceparent = traceparent
        self.process_memory = process_memory
        self.socket_reason = socket_reason
        self.same_host = same_host or {"setup": 0.0, "copy_in": 0.0, "job": 0.0,
                                       "copy_out": 0.0}
        self.stripes = stripes
        self.attempts = attempts
        self.resumed = resumed
        self.group_id = group_id
        self.stats = stats

    def __repr__(self):
        return ("MultiplyInfo(mode=%r, stripes=%d, attempts=%d, resumed=%d, group_id=%r)"
                % (self.mode, self.stripes, self.attempts, self.resumed, self.group_id))


def _enum_value(value, names, what):
    if isinstance(value, str):
        try:
            return names[value.lower()]
        except KeyError:
            raise ValueError("dgmm: unknown %s %r; expected one of %s"
                             % (what, value, ", ".join(sorted(names)))) from None
    return int(value)  # A dgmm.pb enum value, passed through.


def _error(core_error, info=None):
    """A DgmmError from a _core.Error(code, message, attempts, pushback_ms, stripes, mode)."""
    code, message, _attempts, pushback_ms, _stripes, _mode = core_error.args
    trailing = () if pushback_ms is None else (("grpc-retry-pushback-ms", str(pushback_ms)),)
    status = _STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN)
    if status == grpc.StatusCode.INVALID_ARGUMENT and info is None:
        return InvalidArgumentError(message)
    error = DgmmError(status, message, trailing)
    error.info = info
    return error


# ---- Arrays on a GPU (CuPy, PyTorch, anything with __cuda_array_interface__ or
# a CUDA __dlpack__) are copied to the host, and C goes back as the same kind.

def _device_kind(array):
    """"torch", "cupy" or None (a host array)."""
    module = type(array).__module__ or ""
    if module.startswith("torch"):
        return "torch"
    if hasattr(array, "__cuda_array_interface__"):
        return "cupy"
    dlpack_device = getattr(array, "__dlpack_device__", None)
    if dlpack_device is not None:
        try:
            device_type = dlpack_device()[0]
        except Exception:  # noqa: BLE001 - not a usable DLPack producer: a host array
            return None
        if int(device_type) in (2, 3, 13):  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
            return "cupy"
    return None


def _torch_bfloat16(tensor):
    """True for a torch.bfloat16 tensor, which NumPy can only hold as
    ml_dtypes.bfloat16 (its 16-bit patterns, moved as int16); ValueError when
    ml_dtypes is not importable."""
    import torch
    if tensor.dtype != torch.bfloat16:
        return False
    if _BFLOAT16 is None:
        raise ValueError("dgmm: a torch.bfloat16 tensor needs ml_dtypes (pip install ml_dtypes) "
                         "to be a NumPy array; or convert it first, e.g. tensor.float()")
    return True


def _to_host(array, kind):
    if kind == "torch":
        if _torch_bfloat16(array):
            import torch
            return array.detach().cpu().view(torch.int16).numpy().view(_BFLOAT16)
        return array.detach().cpu().numpy()
    import cupy  # Only callers with CUDA arrays need CuPy.
    array = cupy.asarray(array)
    try:
        return cupy.asnumpy(array, order="A")  # Fortran order stays Fortran order.
    except TypeError:  # A CuPy without `order`: C order.
        return cupy.asnumpy(array)


def _host_target(out, kind):
    """The host array the job writes C into when `out` is a device array."""
    if kind == "torch":
        if out.device.type == "cpu":
            if _torch_bfloat16(out):
                import torch
                return out.view(torch.int16).numpy().view(_BFLOAT16)  # Shares its memory.
            return out.numpy()  # Shares the tensor's memory.
        return None
    return None


def _to_device(c, like, kind, out):
    """C (a NumPy array) as `like`'s kind of array, on its device; into `out` if given."""
    if kind == "torch":
        import torch
        if _BFLOAT16 is not None and c.dtype == _BFLOAT16:
            result = torch.from_numpy(c.view(np.int16)).view(torch.bfloat16)
        else:
            result = torch.from_numpy(c)
        if out is not None:
            if out.data_ptr() != result.data_ptr():
                out.copy_(result)
            return out
        return result.to(like.device) if like.device.type != "cpu" else result
    import cupy
    device = getattr(getattr(like, "device", None), "id", None)
    with cupy.cuda.Device(device):
        result = cupy.asarray(c, order="K")
        if c.flags.f_contiguous and not c.flags.c_contiguous and not result.flags.f_contiguous:
            result = cupy.asfortranarray(result)  # Fortran order stays Fortran order.
        if out is not None:
            cupy.copyto(out, result)
            return out
        return result


class _Job:
    """A checked job: A as a wire-ready array (in place when it already is
    one), the diagonal(s), and the header fields."""

    __slots__ = ("a", "diagonal", "right", "diagonal_dtype", "wire_dtype", "dtype_enum",
                 "col_major", "order", "rows", "cols", "side", "backend", "num_lines",
                 "result_dtype")

    def __init__(self, a, d, side, backend):
        self.backend = backend_value(backend)  # Rule 4 first: a bad name is refused before anything.
        a = np.asarray(a)
        if a.ndim != 2:
            raise ValueError("dgmm: A must be a 2-D matrix, got an array of shape %s" % (a.shape,))
        wire = _little_endian(a.dtype)
        if wire not in _WIRE_DTYPES:
            raise ValueError("dgmm: A must be float16, bfloat16 (ml_dtypes), float32, float64, "
                             "complex64 or complex128, got %s; convert it first, e.g. "
                             "A.astype(numpy.float64)" % a.dtype)
        self.wire_dtype, self.dtype_enum = wire, _WIRE_DTYPES[wire]
        if a.flags.c_contiguous:
            self.col_major = False
        elif a.flags.f_contiguous:
            self.col_major = True
        else:
            a = np.ascontiguousarray(a)
            self.col_major = False
        if a.dtype != self.wire_dtype:
            a = a.astype(self.wire_dtype)  # Only non-little-endian input is copied.
        self.a = a
        self.order = "F" if self.col_major else "C"
        self.rows, self.cols = a.shape
        self.num_lines = self.cols if self.col_major else self.rows

        self.side = _enum_value(side, _ALL_SIDES, "side")
        self.right = None
        if self.side == pb.SIDE_BOTH:
            if not isinstance(d, (tuple, list)) or len(d) != 2:
                raise ValueError("dgmm: side='both' takes the diagonals as a pair (l, r): "
                                 "C = diag(l)·A·diag(r)")
            left, right = self._diagonal(d[0], "left"), self._diagonal(d[1], "right")
            if left.dtype != right.dtype:  # one diagonal dtype on the wire: both widened to it
                both = _DTYPE_OF[_promote(_WIRE_DTYPES[left.dtype], _WIRE_DTYPES[right.dtype])]
                left, right = (np.ascontiguousarray(x, dtype=both) for x in (left, right))
            self.diagonal, self.right = left, right
        else:
            self.diagonal = self._diagonal(d, "")
        d_enum = _WIRE_DTYPES[self.diagonal.dtype]
        self.diagonal_dtype = d_enum if d_enum != self.dtype_enum else 0
        # C's dtype: NumPy's result_type of A and d (wider than A's for a
        # wider or complex d); the server computes it.
        self.result_dtype = _DTYPE_OF[_promote(self.dtype_enum, d_enum)]

    def _diagonal(self, d, which):
        """One diagonal, wire-ready: as it is when its dtype is one dgmm
        takes (the server promotes A and d, as NumPy does), else (integers,
        bool, ...) converted to A's dtype (a complex one to complex128)."""
        d = np.asarray(d)
        what = "the %s diagonal" % which if which else "the diagonal"
        if d.ndim != 1:
            raise ValueError("dgmm: %s must be a 1-D array, got shape %s" % (what, d.shape))
        wire = _little_endian(d.dtype)
        if wire in _WIRE_DTYPES:
            if d.dtype != wire or not d.flags.c_contiguous:
                d = np.ascontiguousarray(d, dtype=wire)
            return d
        if d.dtype.kind not in "biufc":
            raise ValueError("dgmm: %s must be numbers, got %s" % (what, d.dtype))
        if d.dtype.kind == "c":
            if d.dtype.itemsize > 16:
                raise ValueError("dgmm: %s is %s; dgmm takes complex64 and complex128, convert "
                                 "it first, e.g. d.astype(numpy.complex128)" % (what, d.dtype))
            return np.ascontiguousarray(d, dtype="<c16")
        return np.ascontiguousarray(d, dtype=self.wire_dtype)

    def core_args(self, c):
        """The positional arguments of _core.Job and of a multiply_batch
        tuple from `a` to `backend`, and the keyword ones."""
        return ((_for_buffer(self.a), _for_buffer(self.diagonal), _for_buffer(c), self.rows,
                 self.cols, self.dtype_enum, self.col_major, self.side, self.backend),
                {"diagonal_dtype": self.diagonal_dtype,
                 "right": None if self.right is None else _for_buffer(self.right)})

    def new_output(self):
        return np.empty((self.rows, self.cols), dtype=self.result_dtype, order=self.order)

    def check_output(self, out):
        """The caller's output array, or ValueError."""
        if not isinstance(out, np.ndarray) or out.shape != (self.rows, self.cols) or \
                out.dtype != self.result_dtype or not out.flags.writeable or \
                not out.flags[("F" if self.col_major else "C") + "_CONTIGUOUS"]:
            raise ValueError("dgmm: out must be a writable %s-order %s array of shape %s (the "
                             "result's dtype: NumPy's result_type of A and d)"
                             % (self.order, self.result_dtype, (self.rows, self.cols)))
        return out


def _merged_stats(stats_list):
    """One JobStats for a job from its parts' stats: byte counts summed, times
    the longest part's."""
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


class _Pending:
    """A started job (Client._start), finished by _finish: the _core.Job and
    how to hand its result back."""

    __slots__ = ("handle", "out", "kind", "like", "device_out", "return_stats", "return_info")

    def __init__(self, handle, out, kind, like, device_out, return_stats, return_info):
        self.handle = handle
        self.out = out
        self.kind = kind
        self.like = like
        self.device_out = device_out
        self.return_stats = return_stats
        self.return_info = return_info

    def finish(self, wait):
        """The multiply() result; wait: run() the job here (Ctrl-C cancels
        it), else result() of a job start()ed before."""
        try:
            (mode, stripes, attempts, resumed, _received, stats, socket_reason, phases,
             process_memory, traceparent) = self.handle.run() if wait else self.handle.result()
        except _core.Error as e:
            _code, _message, failed_attempts, _pushback, plan_stripes, plan_mode = e.args
            info = MultiplyInfo(plan_mode, plan_stripes, failed_attempts, 0, "",
                                [None] * plan_stripes)
            raise _error(e, info) from None
        finally:
            self.handle = None  # Releases the buffers.
        c = self.out
        if self.kind is not None:
            c = _to_device(c, self.like, self.kind, self.device_out)
        if not (self.return_stats or self.return_info):
            return c
        part_stats = [pb.JobStats.FromString(s) for s in stats]
        result = [c]
        if self.return_stats:
            result.append(_merged_stats(part_stats))
        if self.return_info:
            group_id = part_stats[0].group.id if stripes > 1 and part_stats else ""
            result.append(MultiplyInfo(mode, stripes, attempts, resumed, group_id, part_stats,
                                       socket_reason,
                                       dict(zip(("setup", "copy_in", "job", "copy_out"),
                                                phases)),
                                       process_memory, traceparent))
        return tuple(result)


def _tls_of(credentials, options):
    """(root, chain, key, server_name) of grpc.ssl_channel_credentials(...)."""
    inner = getattr(credentials, "_credentials", None)
    if inner is None or not hasattr(inner, "_pem_root_certificates"):
        raise TypeError("dgmm: credentials must come from grpc.ssl_channel_credentials(root_ca, "
                        "private_key, certificate_chain), got %r" % (credentials,))
    server_name = dict(options).get("grpc.ssl_target_name_override", "")

    def text(value):
        return value.decode() if isinstance(value, bytes) else (value or "")
    return (text(inner._pem_root_certificates), text(inner._certificate_chain),
            text(inner._private_key), server_name)


# The gRPC channel options Client(options=...) takes (see Client).
_CHANNEL_OPTIONS = ("grpc.ssl_target_name_override", "grpc.lb_policy_name")


class Client:
    """A connection to a dgmm server. Thread-safe; close() it (or use `with`).

    Args:
      target: "host:port" (any gRPC target string; "ipv4:h:p1,h:p2" or a DNS
        name with several addresses, with load_balancing_policy="round_robin",
        spreads jobs and the parts of striped jobs over every replica).
      credentials: TLS, from grpc.ssl_channel_credentials(root_ca) or, for
        mutual TLS, grpc.ssl_channel_credentials(root_ca, client_key,
        client_cert); None for plaintext.
      token: bearer token for servers started with --auth_token_file; sent as
        `authorization: Bearer <token>` on every dgmm call (use TLS with it).
      options: gRPC channel options, as (name, value) pairs, of the names the
        client's channels (the C++ client's) take: "grpc.ssl_target_name_override"
        and "grpc.lb_policy_name"; any other name is a ValueError.
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
      local_socket: for region calls (dgmm.regions) and the same-host path,
        the path of the server's local socket as this process sees it;
        default $DGMM_LOCAL_SOCKET, else the path the server reports
        (GetServerInfo's limits.local_socket). Set it in a container that
        mounts the socket's directory elsewhere.
      same_host: True (default): when the server is on this host and takes
        regions, multiply() moves matrices of 1 MiB and more through a
        staging region of this client (a sealed memfd the server maps,
        registered once and reused) instead of the socket: info.mode is then
        "shm". Otherwise, or when that path fails before the job ran, the
        socket, and info.socket_reason says why. False: always the socket
        (dgmm arrays too: see dgmm.arrays).
      process_memory: True (default): on the same-host path, the server reads
        A from, and writes C into, this process's own arrays (Linux
        process_vm_readv/writev; granted to a process of the server's uid in
        its PID namespace): no staging region, no copies, and
        info.process_memory is True. Otherwise the staging region carries
        the job. False: always the staging region.

    Each Client has its own connection, as a client in another process would.
    A striped job with K parts uses K connections, made when first needed
    and kept. A multiply() with a `timeout` or `stripes` other than the
    client's uses a C++ client of its own for that pair (kept, with its
    connections, for the next such call). The first region call opens a
    session on the server's local socket, kept until close() (which ends it:
    the server then drops the regions registered through this client).
    """

    def __init__(self, target, *, credentials=None, token=None, options=(),
                 max_unary_message_bytes=None, chunk_bytes=None, stripes=None,
                 unary_limit_bytes=None, block_bytes=None, retry=None,
                 load_balancing_policy=None,
                 initial_reconnect_backoff=0.1, min_reconnect_backoff=2.0,
                 max_reconnect_backoff=1.0, local_socket=None, same_host=True,
                 process_memory=True):
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
            _check_stripes(stripes)
        self._stripes = stripes
        self._retry = retry if retry is not None else RetryPolicy()
        options = list(options)
        for name, _value in options:
            if name not in _CHANNEL_OPTIONS:
                raise ValueError("dgmm.Client: the channel option %r is not one the client "
                                 "takes (%s)" % (name, ", ".join(sorted(_CHANNEL_OPTIONS))))
        lb = dict(options).get("grpc.lb_policy_name", load_balancing_policy)
        self._options = {
            "max_unary_message_bytes": self._max_unary,
            "chunk_bytes": self._chunk,
            "stripes": 0 if stripes is None else int(stripes),
            "token": token,
            "load_balancing_policy": lb,
            "tls": None if credentials is None else _tls_of(credentials, options),
            "retry": (self._retry.max_attempts, self._retry.initial_backoff,
                      self._retry.max_backoff, self._retry.backoff_multiplier,
                      self._retry.max_reconnect_wait),
            "initial_reconnect_backoff": initial_reconnect_backoff,
            "min_reconnect_backoff": min_reconnect_backoff,
            "max_reconnect_backoff": max_reconnect_backoff,
            "same_host": bool(same_host),
            "process_memory": bool(process_memory),
            "local_socket": local_socket or os.environ.get("DGMM_LOCAL_SOCKET") or None,
        }
        self._same_host = bool(same_host)
        self._target = target
        self._lock = threading.Lock()
        self._closed = False
        # The region session (dgmm.regions.LocalSession: the C++ client's own),
        # taken by dgmm.regions on the first region call; _session_lock
        # serializes taking it.
        self._local_session = None
        self._session_lock = threading.Lock()
        try:
            self._core = _core.Client(target, self._options)
        except _core.Error as e:
            raise _error(e) from None
        # C++ clients for other (timeout, stripes) pairs; None: this one's.
        self._cores = {(None, None): self._core}

    def _core_for(self, timeout, stripes):
        key = (_timeout_seconds(timeout), None if stripes is None else _check_stripes(stripes))
        with self._lock:
            if self._closed:
                raise DgmmError(grpc.StatusCode.CANCELLED, "dgmm: the client is closed")
            core = self._cores.get(key)
            if core is None:
                options = dict(self._options)
                if key[0] is not None:
                    options["timeout"] = key[0]
                if key[1] is not None:
                    options["stripes"] = key[1]
                try:
                    core = _core.Client(self._target, options)
                except _core.Error as e:
                    raise _error(e) from None
                if len(self._cores) > 16:  # Keep the default; drop the oldest other.
                    del self._cores[next(k for k in self._cores if k != (None, None))]
                self._cores[key] = core
            return core

    def close(self):
        with self._lock:
            self._closed = True
            self._cores = {}
            self._core = None
            session, self._local_session = self._local_session, None
        if session is not None:
            session.close()  # The server drops this client's regions.

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def multiply(self, a, d, side="right", backend="auto", timeout=None, *,
                 stream=None, stripes=None, out=None, return_stats=False, return_info=False,
                 progress=None, traceparent=None, tracestate=None):
        """Returns C = A·diag(d) (side="right"), diag(d)·A (side="left") or,
        with side="both" and d a pair (l, r), diag(l)·A·diag(r) in one pass.

        A is a 2-D float16, bfloat16 (ml_dtypes.bfloat16, where ml_dtypes is
        installed), float32, float64, complex64 or complex128 array (half
        types are computed in float32 and rounded once; docs/dtypes.md):
        NumPy, anything with the buffer protocol, or a CUDA array (CuPy,
        PyTorch, __cuda_array_interface__ or a CUDA __dlpack__), which is
        copied to the host and whose C comes back as the same kind of array
        on its device (a CPU torch.Tensor gives a torch.Tensor). C has A's
        layout (C order stays C order, Fortran order stays Fortran order;
        any other array is sent as a C-order copy) and NumPy's
        result_type(A.dtype, d.dtype) (dgmm.result_dtype): A's dtype for a d
        of the same or a narrower dtype, the wider one otherwise (float32 A
        with a float64 d gives float64, a real A with a complex d the complex
        type wide enough, float16 with bfloat16 float32); A itself is read
        in place. d is 1-D and sent as it is when it is of one of those six
        dtypes (the server promotes); a d of another dtype (integers, ...)
        is converted to A's dtype (a complex one to complex128) first. With
        side="both", l and r of two dtypes are both sent as their result
        type.
        backend: "auto", "cpu", "cuda-kernel" or "cublas" (a
        hint; also the enum names "BACKEND_CPU", ... or dgmm.pb values); any
        other name raises dgmm.InvalidArgumentError (a DgmmError with code
        INVALID_ARGUMENT, and a ValueError) before any call.
        timeout: seconds for the whole job, all parts and attempts included;
        None for no deadline.
        stream: True/False forces MultiplyStream/Multiply for every part;
        None picks by size (policy rule 1).
        stripes: K, the number of parts sent at once over K connections;
        None: the client's default (auto by size). K is capped at the number
        of lines (rows of a C-order A, columns of a Fortran-order one).
        out: optional array for C (A's shape and layout, the result
        dtype above, contiguous and writable; for a CUDA A, a CUDA array of that
        shape): the result lands in it in place and it is returned; by
        default a new array. When A (and out) are dgmm arrays of this
        client (dgmm.empty, zeros, asarray) or views of SharedMemoryRegions
        registered with it, the job runs on that memory with no copy
        (MultiplyRegion: in place when out is A; out=None makes C a new
        dgmm array); see dgmm.arrays.
        progress: optional callable(lines_done, total_lines), called from the
        client's threads as result lines arrive; an exception it raises
        cancels the job and is raised by multiply().
        With return_stats=True, returns (C, dgmm.pb.JobStats) (for a striped
        job: byte counts summed over the parts, times the longest part's);
        with return_info=True, (C, dgmm.MultiplyInfo) (mode, stripes,
        attempts, per-part stats); with both, (C, stats, info).
        Failed parts are retried, and streamed parts resumed, as the client's
        RetryPolicy says. Ctrl-C (KeyboardInterrupt) cancels the job's calls
        and is raised once they have stopped.
        traceparent, tracestate: W3C trace context (docs/protocol.md, "Trace
        context") sent with every call of the job (every part, stripe and
        retry: the same value); None: the client makes a new traceparent
        for the job (info.traceparent). An invalid traceparent, or a
        tracestate without one, raises a DgmmError with code
        INVALID_ARGUMENT before any call. (A job on dgmm arrays in this client's regions, see
        dgmm.arrays, carries none yet.)

        Raises ValueError for arrays dgmm cannot take, DgmmError when the
        job fails (see .code and .details; .info is the MultiplyInfo of the
        failed job, None when the client refused it before any call).
        """
        return self._start(a, d, side, backend, timeout, stream, stripes, out, return_stats,
                           return_info, progress, traceparent, tracestate).finish(wait=True)

    def _start(self, a, d, side, backend, timeout, stream, stripes, out, return_stats,
               return_info, progress, traceparent=None, tracestate=None):
        """Checks the arrays and makes the job (not started yet): a _Pending."""
        if stream is None and self._same_host and isinstance(a, np.ndarray):
            # A (and out) in regions registered with this client: a
            # MultiplyRegion on them, no copy (dgmm.arrays); else None.
            pending = self._region_arrays_job(a, d, side, backend, timeout, out, return_stats,
                                              return_info, progress)
            if pending is not None:
                return pending
        like, device_out, kind = a, None, None
        if type(a) is not np.ndarray or type(d) is not np.ndarray:  # NumPy's is the fast path
            kind = _device_kind(a)
            if kind is not None:
                a = _to_host(a, kind)  # A CPU tensor's .numpy() is its own memory, read in place.
            d_kind = _device_kind(d)
            if d_kind is not None:
                d = _to_host(d, d_kind)
        job = _Job(a, d, side, backend)
        if kind is not None and out is not None:
            device_out = out
            out = _host_target(out, kind)
        core = self._core if timeout is None and stripes is None else None
        if core is None:
            core = self._core_for(timeout, stripes)
        c = job.new_output() if out is None else job.check_output(out)
        mode = -1 if stream is None else (1 if stream else 0)
        args, kwargs = job.core_args(c)
        try:
            handle = _core.Job(core, *args, mode, progress, traceparent=traceparent or "",
                               tracestate=tracestate or "", **kwargs)
        except _core.Error as e:
            raise _error(e) from None
        return _Pending(handle, c, kind, like, device_out, return_stats, return_info)

    def multiply_batch(self, jobs, timeout=None, *, return_stats=False, traceparent=None,
                       tracestate=None):
        """Runs many small independent jobs in one MultiplyBatch call: the
        RPC's cost is paid once for all of them (docs/protocol.md,
        "MultiplyBatch").

        jobs: a sequence of (a, d), (a, d, side) or (a, d, side, backend)
        tuples, each as multiply()'s arguments (host arrays: NumPy or the
        buffer protocol). Returns a list with one entry per job, in order:
        C (A's shape and layout, NumPy's result dtype of A and d as for
        multiply()), or (C, dgmm.pb.JobStats) with
        return_stats=True; a job that failed on its own (a bad diagonal, a
        job that can never fit, ...) has its DgmmError in its place,
        returned, not raised: one bad job does not fail the others.
        Raises ValueError for arrays dgmm cannot take (before any call), and
        DgmmError when the call itself fails: the batch over the server's
        message size or --max_batch_jobs (RESOURCE_EXHAUSTED), its jobs
        together over the memory budget, the deadline (`timeout` seconds for
        the whole call), the transport. The whole batch is retried as the
        client's RetryPolicy says (jobs are pure). The batch must fit one
        message (GetServerInfo().limits.max_unary_message_bytes); send large
        jobs with multiply().
        traceparent, tracestate: as multiply()'s, for the one call (every
        job's stats name its trace id); None: a new traceparent.
        """
        prepared = []
        for item in jobs:
            if not 2 <= len(item) <= 4:
                raise ValueError("dgmm: a batch job is (a, d), (a, d, side) or "
                                 "(a, d, side, backend)")
            a, d = item[0], item[1]
            side = item[2] if len(item) > 2 else "right"
            backend = item[3] if len(item) > 3 else "auto"
            job = _Job(a, d, side, backend)
            prepared.append((job, job.new_output()))
        core = self._core if timeout is None else self._core_for(timeout, None)
        try:
            outcomes = core.multiply_batch([
                args + (kwargs["diagonal_dtype"], kwargs["right"])
                for args, kwargs in (job.core_args(c) for job, c in prepared)],
                traceparent=traceparent or "", tracestate=tracestate or "")
        except _core.Error as e:
            raise _error(e, info=False) from None
        results = []
        for (_job, c), (code, message, stats) in zip(prepared, outcomes):
            if code != 0:
                results.append(DgmmError(_STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN),
                                         message))
            elif return_stats:
                results.append((c, pb.JobStats.FromString(stats)))
            else:
                results.append(c)
        return results

    def _region_arrays_job(self, a, d, side, backend, timeout, out, return_stats, return_info,
                           progress):
        """Replaced by dgmm.arrays (imported with the package): the job on
        registered regions as a pending job, or None for the C++ client."""
        return None

    def server_info(self, timeout=None):
        """The server's dgmm.pb.GetServerInfoResponse (devices, budgets, limits)."""
        try:
            return pb.GetServerInfoResponse.FromString(
                self._core_for(None, None).server_info(_timeout_seconds(timeout)))
        except _core.Error as e:
            raise _error(e, info=False) from None

    def health(self, service="", timeout=None):
        """The grpc.health.v1 status of `service` ("" = the whole server):
        "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN"."""
        try:
            state = self._core_for(None, None).health(service, _timeout_seconds(timeout))
        except _core.Error as e:
            raise _error(e, info=False) from None
        return _HEALTH_NAMES.get(state, str(state))


def _timeout_seconds(timeout):
    """A call's timeout: positive seconds, or None (no deadline)."""
    if timeout is None:
        return None
    if not float(timeout) > 0:
        raise ValueError("dgmm: timeout must be positive seconds or None, got %r" % (timeout,))
    return float(timeout)


def _ms(seconds):
    """Seconds as a whole number of milliseconds for a channel argument."""
    return max(1, min(int(round(seconds * 1000)), 2**31 - 1))


# Kept for code that used it: the health messages (grpc.health.v1).
HealthCheckRequest = _health.HealthCheckRequest
