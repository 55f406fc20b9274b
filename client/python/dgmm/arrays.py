"""dgmm.arrays: NumPy arrays in memory the server maps, and the
zero-copy path of Client.multiply.

    import numpy as np, dgmm
    with dgmm.Client("127.0.0.1:50051") as client:
        a = dgmm.empty((4000, 3000), np.float32, client=client)   # or dgmm.zeros
        a[:] = ...                                # fill it where it lives
        c = dgmm.empty_like(a, client=client)
        client.multiply(a, d, out=c)              # C = A·diag(d) into c: no copy
        client.multiply(a, d, out=a)              # in place: no copy
        b = dgmm.asarray(existing, client=client) # one copy in, none per job

Each array is a SharedMemoryRegion of its own (a sealed memfd, rounded up
to whole pages) registered with `client`'s server under the name
dgmm-array-<pid>-<tag>-<n>; the region lives as long as the array (it is the
array's base object, held by every view of it). When the last view goes,
the region is kept for reuse by dgmm.empty (at most POOL_REGIONS of them,
for POOL_SECONDS: fresh shared memory costs its first job page faults), then
a background thread unregisters and unmaps it. Client.close() ends the
client's session: the server drops the regions, and the arrays stay usable
as plain memory (a multiply on them then copies, as for any array).

Client.multiply(a, d, out=...) finds the regions by address: when `a` lies
in a host region registered with that client (a dgmm array or a view of a
SharedMemoryRegion) and is C- or Fortran-contiguous (any dtype jobs take), and
`out` is None, `a` itself or lies in such a region too, with a's shape,
dtype and order, the job is one MultiplyRegion on those regions: the server
reads A and writes C where they are (info.mode "shm"). With out=None a new
dgmm array is made for C (for A of 1 MiB and more; smaller jobs go over the
socket). A diagonal in a registered region is read from there too. Anything
else takes the C++ client's path (same-host staging or the socket). So does
a client made with same_host=False, or a call with stream= forced.

A region job that the server refuses before it ran (no such region, a
closed session, regions off, RESOURCE_EXHAUSTED) is run again on the C++
client's path, and info.socket_reason says why; so is one that failed
otherwise (UNAVAILABLE, INTERNAL, UNKNOWN) when C is not A (A is intact).
An in-place job that failed that way raises: A may be half-written.
"""

import itertools
import mmap
import os
import queue
import threading
import time
import weakref

import grpc
import numpy as np

from . import _core
from .client import Client, DgmmError, MultiplyInfo, _Job, _enum_value, _error, _merged_stats, \
    _SIDES, backend_value, result_dtype
from .regions import _DTYPES, SharedMemoryRegion, _find_ref, _np_dtype_of, _REGISTRY, \
    _REGISTRY_LOCK, _session
from .v1 import dgmm_pb2 as pb

__all__ = ["empty", "empty_like", "zeros", "asarray", "region_of"]

# The C++ client's same_host_min_bytes: with out=None, a smaller A goes over
# the socket (registering a region for C would cost more than the message).
NEW_RESULT_MIN_BYTES = 1 << 20
_PAGE = mmap.PAGESIZE
_COUNTER = itertools.count()
_TAG = os.urandom(3).hex()  # names stay unique across PID namespaces of one uid
# The server ran none of the job, or C is not A: the C++ client's path may redo it.
_NOT_RUN = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED)
_MAYBE_RUN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


# ------------------------------------------------------------ the arrays


class _Owner:
    """The base object of a dgmm array: its region, and the mapping (held
    through an export, so that closing the region cannot unmap it under a
    view). When it goes, its region is released on the reaper thread."""

    __slots__ = ("region", "_keep", "__array_interface__", "__weakref__")


# Regions whose arrays are gone: put here by the arrays' finalizers (which run
# wherever the GC does, maybe holding locks: SimpleQueue.put is safe there),
# then kept a moment for reuse by empty() (warm memory: a new region's first
# job pays the page faults of fresh shared memory, several times a warm
# job's time) and otherwise unregistered and unmapped by a daemon thread.
_DEAD = queue.SimpleQueue()
# At most this many regions of dead arrays are kept, each at most this long.
POOL_REGIONS = 4
POOL_SECONDS = 2.0
_pool_lock = threading.Lock()
_pool = []  # [(time freed, region)], oldest first; guarded by _pool_lock
_reaper_pid = None  # guarded by _pool_lock


def _release(region):
    """Unregisters (the server frees its mapping) and unmaps `region`."""
    try:
        region.unregister(timeout=10)
    except Exception:  # noqa: BLE001 - closed client or channel: the session took it
        region.client = region.name = region._session = None
    try:
        region.close()
    except Exception:  # noqa: BLE001
        pass


def _admit_dead(now):
    """Moves the regions of dead arrays into the pool; then the regions the
    pool no longer keeps (too many, too old, or their session gone), to be
    released by the caller. With _pool_lock held."""
    while True:
        try:
            region = _DEAD.get_nowait()
        except queue.Empty:
            break
        _pool.append((now, region))
    keep, drop = [], []
    for i, (freed, region) in enumerate(_pool):
        if (len(_pool) - i > POOL_REGIONS or now - freed > POOL_SECONDS or
                not region.registered):
            drop.append(region)
        else:
            keep.append((freed, region))
    _pool[:] = keep
    return drop


def _reap():
    while True:
        with _pool_lock:
            wait = POOL_SECONDS / 2 if _pool else None
        try:
            region = _DEAD.get(timeout=wait)  # Woken by a death (or the clock).
        except queue.Empty:
            region = None
        with _pool_lock:
            if region is not None:
                _pool.append((time.monotonic(), region))
            drop = _admit_dead(time.monotonic())
        for region in drop:
            _release(region)


def _start_reaper():
    global _reaper_pid
    with _pool_lock:
        if _reaper_pid != os.getpid():  # First use, or a forked child.
            _pool.clear()
            threading.Thread(target=_reap, name="dgmm-array-reaper", daemon=True).start()
            _reaper_pid = os.getpid()


def _take_pooled(client, size):
    """A kept region of `client` of exactly `size` bytes, or None."""
    with _pool_lock:
        drop = _admit_dead(time.monotonic())
        found = None
        for i, (_, region) in enumerate(_pool):
            if region.client is client and region.byte_size == size:
                found = _pool.pop(i)[1]
                break
    for region in drop:
        _release(region)
    return found


def _drain(client):
    """Releases every kept region of `client` now; how many."""
    with _pool_lock:
        _admit_dead(time.monotonic())
        mine = [region for _, region in _pool if region.client is client]
        _pool[:] = [(t, region) for t, region in _pool if region.client is not client]
    for region in mine:
        _release(region)
    return len(mine)


def _sync_client(client):
    client = getattr(client, "sync", client)  # a dgmm.aio.Client
    if not isinstance(client, Client):
        raise TypeError("dgmm: client= must be a dgmm.Client (or dgmm.aio.Client), got %s"
                        % type(client).__name__)
    return client


def _job_dtype(dtype):
    """`dtype` little-endian, when jobs take it (regions._DTYPES: float16,
    float32, float64, complex64, complex128, and ml_dtypes.bfloat16 where
    ml_dtypes is importable); else ValueError."""
    dtype = np.dtype(dtype)
    wire = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    if wire not in _DTYPES:
        raise ValueError("dgmm: a dgmm array is float16, float32, float64, complex64, complex128 "
                         "or ml_dtypes.bfloat16 (what jobs take), got %s" % dtype)
    return wire


def _shape(shape):
    shape = tuple(int(n) for n in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
    if any(n < 0 for n in shape):
        raise ValueError("dgmm: negative dimensions are not allowed: %s" % (shape,))
    return shape


def empty(shape, dtype=np.float64, *, client, order="C"):
    """A new NumPy array of `shape` and `dtype` (float16, float32, float64,
    complex64, complex128 or ml_dtypes.bfloat16) in C or
    Fortran `order` whose memory is a region registered with `client`'s
    server (which must be on this host with --allow_regions): jobs on it
    through client.multiply copy nothing. Its contents are undefined (the
    region of an array that died just now may be reused). Raises DgmmError
    when the server cannot take the region (FAILED_PRECONDITION: no
    regions, or not on this host; RESOURCE_EXHAUSTED: --region_memory_budget
    or --max_regions_per_client)."""
    return _empty(shape, dtype, client, order, zero=False)


def _empty(shape, dtype, client, order, zero):
    client = _sync_client(client)
    dtype = _job_dtype(dtype)
    shape = _shape(shape)
    if order not in ("C", "F"):
        raise ValueError("dgmm: order is 'C' or 'F', got %r" % (order,))
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
    _start_reaper()
    region = _take_pooled(client, size)
    if region is None:
        region = SharedMemoryRegion(size, memfd_name="dgmm-array-%d" % os.getpid())
        name = "dgmm-array-%d-%s-%d" % (os.getpid(), _TAG, next(_COUNTER))
        try:
            try:
                region.register(client, name)
            except DgmmError as e:
                # Arrays that went just now may still hold the budget: release them, once.
                if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED or not _drain(client):
                    raise
                region.register(client, name)
        except BaseException:
            region.close()
            raise
    elif zero:
        region.buffer[:] = 0  # New memory is zero; reused memory is not.
    owner = _Owner()
    owner.region = region
    owner._keep = region.buffer
    strides = None
    if order == "F" and len(shape) > 1:
        strides = tuple(int(np.prod(shape[:i], dtype=np.int64)) * dtype.itemsize
                        for i in range(len(shape)))
    # A user dtype (ml_dtypes.bfloat16) has no typestr of its own ("<V2"):
    # made as unsigned integers of its size, then viewed as it.
    typestr = dtype.str if dtype.kind != "V" else "<u%d" % dtype.itemsize
    owner.__array_interface__ = {"version": 3, "shape": shape, "typestr": typestr,
                                 "data": (region.address, False), "strides": strides}
    array = np.asarray(owner)
    if array.dtype != dtype:
        array = array.view(dtype)
    weakref.finalize(owner, _DEAD.put, region).atexit = False
    return array


def zeros(shape, dtype=np.float64, *, client, order="C"):
    """dgmm.empty, filled with zeros (a new region is zero already: no pass over it)."""
    return _empty(shape, dtype, client, order, zero=True)


def empty_like(array, dtype=None, *, client, order="K"):
    """dgmm.empty with `array`'s shape, dtype (unless given) and order
    ("K": Fortran when `array` is Fortran-contiguous only, else C)."""
    array = np.asarray(array)
    return empty(array.shape, array.dtype if dtype is None else dtype, client=client,
                 order=_order_of(array, order))


def _order_of(array, order):
    if order in ("K", "A"):
        return "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
    if order not in ("C", "F"):
        raise ValueError("dgmm: order is 'C', 'F', 'K' or 'A', got %r" % (order,))
    return order


def asarray(array, dtype=None, *, client, order="K"):
    """`array` as a dgmm array of `client` (see empty): returned as it is
    when it already is one (or a view of one) registered with `client`, of
    `dtype` and contiguous in `order`; else copied into a new one. dtype:
    default the array's when a job takes it (see empty), else float64. order: "C",
    "F", or "K"/"A" (Fortran when the array is Fortran-contiguous only)."""
    client = _sync_client(client)
    source = np.asarray(array)
    if dtype is None:
        try:
            dtype = _job_dtype(source.dtype)
        except ValueError:
            dtype = np.float64
    dtype = _job_dtype(dtype)
    order = _order_of(source, order)
    region = region_of(source)
    if (region is not None and region.client is client and region.registered and
            source.dtype == dtype and source.flags[order + "_CONTIGUOUS"] and
            source.flags.writeable):
        return source
    out = empty(source.shape, dtype, client=client, order=order)
    if dtype.name == "bfloat16":
        # NumPy's copyto has no copy function for ml_dtypes.bfloat16 (seen
        # with ml_dtypes 0.6): its bit patterns, after astype's conversion.
        np.copyto(out.view(np.uint16), source.astype(dtype, copy=False).view(np.uint16))
    else:
        np.copyto(out, source, casting="same_kind")
    return out


def region_of(array):
    """The dgmm.SharedMemoryRegion holding a dgmm array (or a view of one),
    else None. .name is its registered name, .registered whether the server
    still has it."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base.region if isinstance(base, _Owner) else None


# -------------------------------------------------------- the jobs on them


def _address(array):
    return array.__array_interface__["data"][0]


def _region_arrays_job(self, a, d, side, backend, timeout, out, return_stats, return_info,
                       progress):
    """Client._start's first step: when A (and out) lie in host regions
    registered with this client, the job as a _RegionJob; else None."""
    with _REGISTRY_LOCK:
        if self._closed or not _REGISTRY.get(self):
            return None
    dtype = a.dtype
    if a.ndim != 2 or a.size == 0 or dtype not in _DTYPES:
        return None
    if side == pb.SIDE_BOTH or (isinstance(side, str) and side.lower() == "both"):
        return None  # two diagonals: the C++ client's path
    try:
        d_dtype = _np_dtype_of(d)
    except (TypeError, ValueError):
        return None  # a diagonal NumPy cannot take as it is: the C++ client's path
    try:
        if result_dtype(dtype, d_dtype) != dtype:
            return None  # C of a wider dtype than A's: the C++ client's path
    except ValueError:
        pass  # a diagonal of another dtype: converted to A's below
    if a.flags.c_contiguous:
        layout = "C"
    elif a.flags.f_contiguous:
        layout = "F"
    else:
        return None
    if out is None:
        if a.nbytes < NEW_RESULT_MIN_BYTES:
            return None
    elif not (isinstance(out, np.ndarray) and out.shape == a.shape and out.dtype == dtype and
              out.flags.writeable and out.flags[layout + "_CONTIGUOUS"]):
        return None  # The C++ path says what is wrong with it.
    a_at = _address(a)
    if _find_ref(self, "host", a_at, a.nbytes) is None:
        return None
    if out is not None and _find_ref(self, "host", _address(out), out.nbytes) is None:
        return None
    # The session, checked now: one the server closed forgets its regions
    # (their names may be another region's by now); then look again.
    try:
        session = _session(self, timeout)
    except DgmmError:
        return None
    matrix = _find_ref(self, "host", a_at, a.nbytes)
    result = None if out is None else _find_ref(self, "host", _address(out), out.nbytes)
    if matrix is None or (out is not None and result is None):
        return None
    rows, cols = a.shape
    header = pb.JobHeader(
        rows=rows, cols=cols, dtype=_DTYPES[dtype],
        layout=pb.LAYOUT_COL_MAJOR if layout == "F" else pb.LAYOUT_ROW_MAJOR,
        side=_enum_value(side, _SIDES, "side"), backend=backend_value(backend))
    diagonal = self._region_diagonal("host", d, dtype, header)
    return _RegionJob(self, session, a, d, side, backend, timeout, layout, header, matrix,
                      diagonal, out, result, return_stats, return_info, progress)


class _RegionJob:
    """A multiply on registered regions, with what dgmm.Client's pending
    jobs have (client._Pending, used by multiply and dgmm.aio): .handle
    (itself: start, run, cancel, add_done_callback) and finish(wait)."""

    def __init__(self, client, session, a, d, side, backend, timeout, layout, header, matrix,
                 diagonal, out, result, return_stats, return_info, progress):
        self._client = client
        self._session = session
        self._a, self._d, self._side, self._backend = a, d, side, backend
        self._timeout = timeout
        self._layout = layout
        self._header = header
        self._matrix = matrix
        self._diagonal = diagonal
        self._out = out
        self._result = result
        self._return_stats = return_stats
        self._return_info = return_info
        self._progress = progress
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._callbacks = []
        self._cancelled = False
        self._core_call = None
        self._core_job = None
        self._started = False
        self._outcome = None
        self._error = None

    # -- the handle
    @property
    def handle(self):
        return self  # (A property: an attribute would be a reference cycle.)

    def start(self):
        """Runs the job on a thread of its own."""
        self._begin()
        threading.Thread(target=self._body, name="dgmm-region-job", daemon=True).start()

    def run(self):
        """Runs the job on this thread (Ctrl-C cancels it)."""
        self._begin()
        self._body()

    def _begin(self):
        if self._started:
            raise ValueError("dgmm: the job was started already")
        self._started = True

    def cancel(self):
        with self._lock:
            self._cancelled = True
            core_call, core_job = self._core_call, self._core_job
        if core_call is not None:
            core_call.cancel()
        if core_job is not None:
            core_job.cancel()

    def add_done_callback(self, callback):
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def finish(self, wait):
        """multiply()'s return value; wait: run the job here first."""
        if wait:
            self.run()
        else:
            self._done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        (c, mode, stripes, attempts, resumed, stats, reason), self._outcome = self._outcome, None
        if not (self._return_stats or self._return_info):
            return c
        result = [c]
        if self._return_stats:
            result.append(_merged_stats(stats))
        if self._return_info:
            group_id = stats[0].group.id if stripes > 1 and stats else ""
            result.append(MultiplyInfo(mode, stripes, attempts, resumed, group_id, stats, reason))
        return tuple(result)

    # -- the job
    def _body(self):
        try:
            self._outcome = self._attempt()
        except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt too: finish raises it
            self._error = e
        finally:
            with self._lock:
                self._done.set()
                callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # noqa: BLE001
                    pass
            self._a = self._d = None  # The arrays are not needed any more.

    def _check_cancelled(self):
        if self._cancelled:
            error = DgmmError(grpc.StatusCode.CANCELLED, "dgmm: the job was cancelled")
            error.info = MultiplyInfo("shm", 1, 1, 0, "", [None])
            raise error

    def _attempt(self):
        client, a = self._client, self._a
        c, result, reason = self._out, self._result, None
        if result is None:
            self._check_cancelled()
            try:
                c = empty(a.shape, a.dtype, client=client, order=self._layout)
                result = _find_ref(client, "host", _address(c), c.nbytes)
            except DgmmError as e:
                c, reason = None, ("no region for C could be registered (%s: %s), so the C++ "
                                   "client's path carried the job" % (e.code.name, e.details))
        if result is not None:
            request = pb.MultiplyRegionRequest(header=self._header, matrix=self._matrix,
                                               result=result)
            if self._diagonal is not None:
                request.diagonal.CopyFrom(self._diagonal)
            try:
                stats = self._call(request)
            except DgmmError as e:
                in_place = np.may_share_memory(a, c)
                if not (e.code in _NOT_RUN or (e.code in _MAYBE_RUN and not in_place)) \
                        or self._cancelled:
                    e.info = MultiplyInfo("shm", 1, 1, 0, "", [None])
                    raise
                reason = ("the same-host job on the arrays' regions failed, so the C++ client's "
                          "path carried it: %s: %s" % (e.code.name, e.details))
            else:
                if self._progress is not None:
                    lines = a.shape[1] if self._layout == "F" else a.shape[0]
                    self._progress(lines, lines)
                return c, "shm", 1, 1, 0, [stats], ""
        return self._through_core(c, reason)

    def _call(self, request):
        """The MultiplyRegion call, through the C++ client's channel
        (_core.RegionCall: made on this thread without the GIL; cancel() and,
        on the main thread, Ctrl-C end it)."""
        client = self._client
        # The default core's channel whatever the timeout (RegionCall applies
        # the deadline itself): a core per timeout would be a channel each.
        core = client._core_for(None, None)
        call = _core.RegionCall(core, "MultiplyRegion")
        with self._lock:
            self._core_call = call
            cancelled = self._cancelled
        if cancelled:
            call.cancel()  # It ends as it starts.
        try:
            response = call.run(request.SerializeToString(), self._session.session,
                                self._timeout)
        except _core.Error as e:
            self._check_cancelled()
            raise _error(e) from None
        return pb.MultiplyRegionResponse.FromString(response).stats

    def _through_core(self, c, reason):
        """The job on the C++ client's path (same-host staging or the socket)."""
        job = _Job(self._a, self._d, self._side, self._backend)
        if c is None:
            c = job.new_output()
        core = self._client._core_for(self._timeout, None)
        args, kwargs = job.core_args(c)
        try:
            core_job = _core.Job(core, *args, -1, self._progress, **kwargs)
        except _core.Error as e:
            raise _error(e) from None
        with self._lock:
            self._core_job = core_job
            cancelled = self._cancelled
        if cancelled:
            core_job.cancel()  # It ends as it starts.
        try:
            (mode, stripes, attempts, resumed, _received, stats, core_reason, _phases, _pm,
             _traceparent) = core_job.run()
        except _core.Error as e:
            _code, _message, failed_attempts, _pushback, plan_stripes, plan_mode = e.args
            raise _error(e, MultiplyInfo(plan_mode, plan_stripes, failed_attempts, 0, "",
                                         [None] * plan_stripes)) from None
        stats = [pb.JobStats.FromString(s) for s in stats]
        return c, mode, stripes, attempts, resumed, stats, ("" if mode == "shm" else reason)


Client._region_arrays_job = _region_arrays_job
