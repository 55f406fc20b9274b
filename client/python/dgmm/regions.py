"""dgmm.regions: the same-host data plane (docs/protocol.md "Regions").

A client on the server's host puts its matrix in memory the server can reach,
registers that memory once under a name, and then runs jobs whose matrix,
result and (optionally) diagonal live there: the request and the response
carry only the header and the stats, no matrix bytes.

Host memory: a memfd this process creates (sealed against shrinking and
growing), shared with the server by passing its file descriptor. NumPy
arrays are views of its mapping.

    import numpy as np, dgmm
    with dgmm.Client("127.0.0.1:50051") as client, \\
         dgmm.SharedMemoryRegion(2 * 1000 * 800 * 8) as shm:
        shm.register(client, "work")
        a = shm.ndarray((1000, 800), np.float64)                 # bytes 0 .. 6.4 MB
        c = shm.ndarray((1000, 800), np.float64, offset=a.nbytes)
        a[:] = np.random.rand(1000, 800)
        stats = client.multiply_region(a, np.arange(800.0), out=c)   # c = a * d
        client.multiply_region(a, np.arange(800.0), out=a)           # in place

GPU memory: any array with __cuda_array_interface__ (CuPy, PyTorch, Numba)
exported with CUDA IPC; the server runs the kernel on it in place on its GPU,
with no PCIe transfer. CuPy is imported only when a CudaIpcRegion is made.

    import cupy
    a = cupy.random.rand(10000, 10000, dtype=cupy.float32)
    with dgmm.CudaIpcRegion(a) as ipc:
        ipc.register(client, "a-gpu")
        client.multiply_region(a, cupy.arange(10000, dtype=cupy.float32), out=a)

The server never opens memory by name for a client. The first region call of
a dgmm.Client opens a session on the server's local socket (a Unix socket
whose path GetServerInfo reports as limits.local_socket; override it with
Client(local_socket=...) or $DGMM_LOCAL_SOCKET), checks that the socket
belongs to the server the client calls (instance_id), and keeps it until
Client.close(); every region RPC carries the session (metadata
`dgmm-session`). The session is the C++ client's own, which its same-host
jobs share (LocalSession below). Host memory is registered by passing its
descriptor through that socket for a one-time ticket. So regions
need the server's host: a client elsewhere cannot reach the socket
(FAILED_PRECONDITION) and streams instead.

A region belongs to this process's uid (and bearer token, when the server
has tokens): every Client of the same uid sees it in region_status and may
run jobs on it or unregister it by name, but it lives only as long as the
session that registered it: Client.close(), or the process exiting, ends
the session and the server drops its regions. Region calls are never
retried: a job in place must not run twice. The server must run with
--allow_regions (GetServerInfo's limits.regions_enabled).
"""

import ctypes
import fcntl
import mmap
import os
import re
import stat
import threading
import time
import weakref

import grpc
import numpy as np

from . import _core
from .client import _ALL_SIDES, Client, DgmmError, InvalidArgumentError, _enum_value, _error, \
    _promote, backend_value
from .v1 import dgmm_pb2 as pb

_KEY = re.compile(r"/[A-Za-z0-9._-]{1,200}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SHM_DIR = "/dev/shm"
# The dtypes of region jobs (multiply_region): float16, float32, float64,
# complex64 and complex128 (bfloat16 too when ml_dtypes is importable).
_DTYPES = {np.dtype("<f4"): pb.DTYPE_FLOAT32, np.dtype("<f8"): pb.DTYPE_FLOAT64,
           np.dtype("<f2"): pb.DTYPE_FLOAT16, np.dtype("<c8"): pb.DTYPE_COMPLEX64,
           np.dtype("<c16"): pb.DTYPE_COMPLEX128}
try:
    import ml_dtypes as _ml_dtypes
    _DTYPES[np.dtype(_ml_dtypes.bfloat16)] = pb.DTYPE_BFLOAT16
except ImportError:  # bfloat16 needs ml_dtypes
    pass
_TYPESTRS = {"<f4": np.dtype("<f4"), "<f8": np.dtype("<f8")}


def _np_dtype_of(x):
    """The NumPy dtype of an array-like: its .dtype (a PyTorch dtype by its
    name: torch.float32 -> float32, torch.bfloat16 -> ml_dtypes.bfloat16),
    else np.asarray's. TypeError/ValueError for what NumPy cannot name."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return np.asarray(x).dtype
    try:
        return np.dtype(dtype)
    except TypeError:
        name = str(dtype).rpartition(".")[2]
        for known in _DTYPES:
            if known.name == name:
                return known
        return np.dtype(name)
# A memfd's seals: its size can never change (so the server needs no SIGBUS
# guard for it, and this process cannot shrink it under the server), and no
# one can add or remove a seal (F_SEAL_WRITE would stop the server's writes).
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _check_name(name):
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("dgmm: a region name is 1-64 characters of [A-Za-z0-9._-], got %r"
                         % (name,))
    return name


def _check_key(key):
    if not isinstance(key, str) or not _KEY.fullmatch(key) or key in ("/.", "/.."):
        raise ValueError("dgmm: a shared-memory key is '/' then 1-200 characters of "
                         "[A-Za-z0-9._-] (not '/.' or '/..'), got %r" % (key,))
    return key


def _closed_client():
    return DgmmError(grpc.StatusCode.CANCELLED, "dgmm: the client is closed")


# ---------------------------------------------------------------- sessions


class LocalSession:
    """This client's session on the server's local socket (docs/protocol.md
    "The local socket"): the C++ client's own (dgmm::LocalSession, which its
    same-host jobs share), seen from Python.

    The server maps only memory its client opened itself: a client on the
    server's host connects to the server's Unix socket (GetServerInfo's
    limits.local_socket, or Client(local_socket=...) or $DGMM_LOCAL_SOCKET),
    where the kernel tells the server the client's uid; says hello and gets
    a session; passes the descriptor of its memory (SCM_RIGHTS) for a
    one-time ticket; and names the ticket in RegisterRegion. Every region
    RPC carries the session in the metadata `dgmm-session`. The session, and
    every region registered under it, lasts while the connection stays open.

    Attributes (from the server's LocalHelloReply): path (the socket as this
    process reached it), session (the secret sent as `dgmm-session`), uid,
    gid, pid (this process's credentials as the server's kernel saw them),
    instance_id, max_tickets, ticket_timeout_ms. Thread-safe.
    """

    def __init__(self, core_session):
        hello = pb.LocalHelloReply.FromString(core_session.hello)
        self._core = core_session
        self._closed = False
        self.path = core_session.path
        self.session = hello.session
        self.uid = hello.uid
        self.gid = hello.gid
        self.pid = hello.pid
        self.instance_id = hello.instance_id
        self.max_tickets = hello.max_tickets
        self.ticket_timeout_ms = hello.ticket_timeout_ms

    @property
    def closed(self):
        """Closed at this end (close(), or a request that failed half-way)."""
        return self._closed

    def alive(self):
        """Whether the connection is still open at both ends."""
        if self._closed:
            return False
        if not self._core.alive():
            self._closed = True
            return False
        return True

    def pass_fd(self, fd, kind=pb.LOCAL_FD_KIND_MEMORY, device=0, allocation_bytes=0):
        """Passes descriptor `fd` (this process keeps its own) and returns the
        server's dgmm.pb.LocalTicket (ticket, object_bytes, sealed). Raises
        DgmmError with the server's code (INVALID_ARGUMENT for a descriptor
        that is not memory, RESOURCE_EXHAUSTED for too many unclaimed
        tickets)."""
        return self._ticket(lambda: self._core.pass_fd(fd, kind, device, allocation_bytes))

    def open_shm(self, key):
        """Asks the server to open POSIX shared-memory object `key` ("/name")
        itself (LocalOpenShm: only an object this uid owns and nobody else may
        write) and returns its dgmm.pb.LocalTicket. Passing the descriptor
        (pass_fd) needs no such rule; this is for clients that cannot."""
        return self._ticket(lambda: self._core.open_shm(key))

    def metadata(self, extra=None):
        """The metadata of a region RPC: `dgmm-session`, plus `extra` pairs."""
        return tuple(extra or ()) + (("dgmm-session", self.session),)

    def close(self):
        """Ends the session: the server drops every region registered under it."""
        self._closed = True
        self._core.close()

    def _ticket(self, request):
        if self._closed:
            raise DgmmError(grpc.StatusCode.CANCELLED,
                            "dgmm: the local session on %s is closed" % self.path)
        try:
            return pb.LocalTicket.FromString(request())
        except _core.Error as e:
            raise _error(e, info=False) from None

    def __repr__(self):
        return ("LocalSession(path=%r, uid=%d, pid=%d, instance_id=%r%s)"
                % (self.path, self.uid, self.pid, self.instance_id,
                   ", closed" if self._closed else ""))


def _open_session(client):
    """The C++ client's session, opened now if it is not open: GetServerInfo,
    then the socket it names (or the client's override), checked to be that
    server's."""
    try:
        return LocalSession(client._core_for(None, None).region_session())
    except _core.Error as e:
        raise _error(e, info=False) from None


def _session(client, timeout=None):
    """The client's open LocalSession, opened on first use. One whose
    connection the server closed (it exited or restarted) is replaced, and
    the regions registered under it are forgotten: the server dropped them."""
    with client._lock:
        if client._closed:
            raise _closed_client()
        session = client._local_session
    if session is not None and session.alive():
        return session
    with client._session_lock:
        with client._lock:
            if client._closed:
                raise _closed_client()
            session = client._local_session
        if session is not None:
            if session.alive():
                return session
            _lose_session(client, session)
        session = _open_session(client)
        with client._lock:
            closed = client._closed
            if not closed:
                client._local_session = session
        if closed:
            session.close()
            raise _closed_client()
        return session


def _lose_session(client, session):
    session.close()
    with client._lock:
        if client._local_session is session:
            client._local_session = None
    lost = []
    with _REGISTRY_LOCK:
        regions = _REGISTRY.get(client, {})
        for name, region in list(regions.items()):
            if region._session is session:
                del regions[name]
                region.client = region.name = region._session = None
                lost.append(name)
    if lost:
        client._regions_lost = sorted(lost)


_RESPONSES = {"MultiplyRegion": pb.MultiplyRegionResponse,
              "RegisterRegion": pb.RegisterRegionResponse,
              "UnregisterRegion": pb.UnregisterRegionResponse,
              "GetRegionStatus": pb.GetRegionStatusResponse}


def _call(client, method, request, timeout, session):
    """One region RPC on the client's own channel (the C++ client's, without
    the GIL) with `session`'s metadata; DgmmError on failure."""
    try:
        response = _core.RegionCall(client._core_for(None, None), method).run(
            request.SerializeToString(), session.session, timeout)
    except _core.Error as e:
        raise _error(e, info=False) from None
    return _RESPONSES[method].FromString(response)


# Registered regions by client, to find the region (and offset) an array lives in.
_REGISTRY_LOCK = threading.Lock()
_REGISTRY = weakref.WeakKeyDictionary()  # Client -> {name: region}


def _registered(client):
    with _REGISTRY_LOCK:
        return list(_REGISTRY.get(client, {}).values())


class _Region:
    """What SharedMemoryRegion and CudaIpcRegion share: one registration with
    one client at a time (register / unregister / close / with)."""

    kind = None

    def __init__(self):
        self.client = None
        self.name = None
        self.status = None  # dgmm.pb.RegionStatus of the registration
        self._session = None  # the LocalSession it was registered under

    # Subclasses: _check_register() (client-side checks, before any ticket),
    # _register_request(name, session, timeout) -> RegisterRegionRequest, and
    # _span() -> (first address, byte size) of the registered memory.

    @property
    def registered(self):
        """Registered, under a session still open at this end (the server
        drops a region when its session ends)."""
        session = self._session
        return self.client is not None and session is not None and not session.closed

    def register(self, client, name, timeout=None):
        """Registers the region with `client` under `name` (1-64 of
        [A-Za-z0-9._-], unique among the regions of this uid on the server).
        Returns self; self.status is the server's RegionStatus (register_ns:
        what mapping and pinning cost, once). The region lives until
        unregistered, or until `client` closes (its session ends)."""
        _check_name(name)
        self._check_register()
        session = _session(client, timeout)  # First: a lost session forgets its regions.
        if self.registered:
            raise ValueError("dgmm: region is already registered as %r; unregister it first"
                             % self.name)
        request = self._register_request(name, session, timeout)
        response = _call(client, "RegisterRegion", request, timeout, session)
        self.client, self.name, self.status, self._session = client, name, response.region, session
        with _REGISTRY_LOCK:
            _REGISTRY.setdefault(client, {})[name] = self
        lost = getattr(client, "_regions_lost", None)
        if lost and name in lost:
            client._regions_lost = [n for n in lost if n != name]
        return self

    def _check_register(self):
        pass

    def unregister(self, timeout=None):
        """Unregisters the region (a job using it finishes first). Returns
        whether the server still had it (False when, e.g., its idle timeout
        already dropped it, or its session ended with its client)."""
        if self.client is None:
            return False
        client, name, session = self.client, self.name, self._session
        self.client = self.name = self._session = None
        with _REGISTRY_LOCK:
            regions = _REGISTRY.get(client, {})
            if regions.get(name) is self:
                del regions[name]
        # A session that ended took the region with it; and the name may since
        # belong to another region of this uid: do not unregister that one.
        if session is None or not session.alive():
            return False
        try:
            response = _call(client, "UnregisterRegion", pb.UnregisterRegionRequest(name=name),
                             timeout, session)
        except DgmmError as e:
            if e.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED,
                          grpc.StatusCode.CANCELLED):
                return False
            raise
        return response.unregistered > 0

    def ref(self, offset=0):
        """A dgmm.pb.RegionRef `offset` bytes into the registered region."""
        if self.client is None:
            raise ValueError("dgmm: region is not registered")
        return pb.RegionRef(name=self.name, offset=int(offset))

    def _locate(self, address, nbytes):
        """The offset of [address, address + nbytes) in the registered range, or None."""
        first, size = self._span()
        if first <= address and address + nbytes <= first + size:
            return address - first
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SharedMemoryRegion(_Region):
    """Host memory this process shares with the server by file descriptor.

    SharedMemoryRegion(byte_size) makes a memfd (memfd_create, close-on-exec)
    of byte_size bytes and, with seal=True (the default), seals it with
    F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL: nobody, this process included,
    can change its size again (ftruncate fails with EPERM), so the server can
    never lose pages under a job. Nothing appears in /dev/shm; the memory is
    freed when this process and the server have both let go of it.

    SharedMemoryRegion(byte_size, key="/name") makes a POSIX shared-memory
    object instead (/dev/shm/name, owner read/write only; it must not exist
    yet), unlinked by close() or at exit; it cannot be sealed.
    SharedMemoryRegion.open(key) maps an existing object this process may
    open for reading and writing (made by the caller, not unlinked by close()),
    and SharedMemoryRegion.from_fd(fd) a memfd or shared-memory descriptor the
    caller has (duplicated; the caller keeps its own).

    Either way the server gets the descriptor itself, through the client's
    local session (LocalSession), never a name to open.

    Attributes: byte_size, fd (this region's descriptor; closed by close()),
    key and path (the POSIX object's, None for a memfd), sealed (the memory
    is sealed against shrinking), address (of the mapping).

    register(client, name, offset=0, byte_size=None) registers a range of it
    (default all of it). ndarray(...) gives NumPy views of the mapping.
    close() (or leaving `with`) unregisters, closes the descriptor, unlinks
    an object it made and unmaps what no view still holds.
    """

    kind = pb.REGION_KIND_SYSTEM_SHM

    def __init__(self, byte_size, key=None, *, seal=True, memfd_name=None):
        byte_size = int(byte_size)
        if byte_size <= 0:
            raise ValueError("dgmm: a shared-memory region needs byte_size > 0")
        self.fd = None
        if key is None:
            fd = os.memfd_create(memfd_name or "dgmm-py-%d" % os.getpid(),
                                 os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, byte_size)
                if seal:
                    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            except BaseException:
                os.close(fd)
                raise
            self._adopt(fd, byte_size, None, None)
            return
        key = _check_key(key)
        path = _SHM_DIR + key  # glibc's shm_open(key) opens exactly this file.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            os.ftruncate(fd, byte_size)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)
            raise
        self._adopt(fd, byte_size, key, path, unlink=True)

    @classmethod
    def open(cls, key):
        """The existing POSIX shared-memory object `key` ("/name", in
        /dev/shm), opened by this process for reading and writing and mapped
        whole. close() leaves the object (its maker unlinks it)."""
        key = _check_key(key)
        path = _SHM_DIR + key
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        return cls._from_owned_fd(fd, key, path)

    @classmethod
    def from_fd(cls, fd):
        """The memfd or shared-memory object open as descriptor `fd` (read
        and write), mapped whole; the region works on a duplicate of `fd`."""
        return cls._from_owned_fd(os.dup(int(fd)), None, None)

    @classmethod
    def _from_owned_fd(cls, fd, key, path):
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size <= 0:
                raise ValueError("dgmm: %s is not a non-empty shared-memory object"
                                 % (path or "descriptor %d" % fd))
        except BaseException:
            os.close(fd)
            raise
        self = cls.__new__(cls)
        self._adopt(fd, st.st_size, key, path)
        return self

    def _adopt(self, fd, byte_size, key, path, unlink=False):
        """Maps descriptor `fd` (owned from here on: closed on failure) of
        byte_size bytes; `unlink`: the object at `path` is this region's."""
        _Region.__init__(self)
        self.fd = fd
        self.key = key
        self.path = path
        self.byte_size = byte_size
        self._unlink = (weakref.finalize(self, _unlink_quietly, path) if unlink
                        else lambda: None)
        try:
            self._mmap = mmap.mmap(fd, byte_size, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            self._unlink()
            raise
        self._close_fd = weakref.finalize(self, os.close, fd)
        self._bytes = np.frombuffer(self._mmap, dtype=np.uint8)  # Every view derives from it.
        self.address = self._bytes.__array_interface__["data"][0]
        self._range = (0, byte_size)

    @property
    def sealed(self):
        """Whether the memory is sealed against shrinking (F_SEAL_SHRINK)."""
        if self.fd is None:
            return False
        try:
            return bool(fcntl.fcntl(self.fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
        except OSError:
            return False  # Not a memfd: no seals.

    def register(self, client, name, offset=0, byte_size=None, timeout=None):
        """Registers bytes [offset, offset + byte_size) of the memory (default:
        all of it) with `client` under `name`; see _Region.register. Passes
        the descriptor through the client's local session for a ticket, and
        names the ticket in RegisterRegion."""
        self._check_open()
        offset = int(offset)
        size = self.byte_size - offset if byte_size is None else int(byte_size)
        if offset < 0 or size <= 0 or offset + size > self.byte_size:
            raise InvalidArgumentError(
                "dgmm: a region of %d bytes at offset %d does not fit the %d bytes of this "
                "shared memory (offset >= 0, byte_size > 0)" % (size, offset, self.byte_size))
        self._range = (offset, size)
        return super().register(client, name, timeout)

    def _register_request(self, name, session, timeout):
        offset, size = self._range
        ticket = session.pass_fd(self.fd)
        return pb.RegisterRegionRequest(
            name=name, local_fd=pb.LocalFdRegion(ticket=ticket.ticket, offset=offset,
                                                 byte_size=size))

    def _span(self):
        offset, size = self._range
        return self.address + offset, size

    @property
    def buffer(self):
        """The whole mapping as a writable uint8 NumPy array."""
        self._check_open()
        return self._bytes

    def ndarray(self, shape, dtype=np.float64, offset=0, order="C"):
        """A NumPy array of `shape` and `dtype` (one multiply_region takes)
        that is a view of the mapping, `offset` bytes from the memory's start,
        in C (row-major) or F (column-major) order. Writing it writes the
        shared memory the server reads; the server's results appear in it."""
        self._check_open()
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in np.atleast_1d(shape))
        nbytes = int(np.prod(shape)) * dtype.itemsize
        offset = int(offset)
        if offset < 0 or offset + nbytes > self.byte_size:
            raise ValueError("dgmm: %d bytes at offset %d do not fit the %d-byte region"
                             % (nbytes, offset, self.byte_size))
        if order not in ("C", "F"):
            raise ValueError("dgmm: order is 'C' or 'F', got %r" % (order,))
        # Derived from self._bytes (np.frombuffer), each view holds the mapping's
        # buffer: close() cannot unmap it under a live view.
        flat = self._bytes[offset:offset + nbytes].view(dtype)
        return flat.reshape(shape, order=order)

    def close(self, timeout=None):
        """Unregisters (errors are ignored: the server drops the region when
        the client's session ends anyway), closes the descriptor, unlinks an
        object this region made, and unmaps. The mapping stays while NumPy
        views of it are alive."""
        if self.client is not None:
            try:
                self.unregister(timeout=timeout)
            except DgmmError:
                pass
        self._unlink()
        if self.fd is not None:
            self._close_fd()
            self.fd = None
        mapping, self._mmap = self._mmap, None
        self._bytes = None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # Views still use it: it is unmapped when the last one goes.

    @property
    def closed(self):
        return self._mmap is None

    def _check_open(self):
        if self._mmap is None:
            raise ValueError("dgmm: the shared-memory region is closed")


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ------------------------------------------------------------ CUDA arrays


def _cuda_interface(array):
    """(data pointer, byte extent, dtype, shape, layout) of a dense 2-D or 1-D
    array with __cuda_array_interface__; layout is "C" or "F"."""
    cai = getattr(array, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError("dgmm: %s has no __cuda_array_interface__" % type(array).__name__)
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    pointer = int(cai["data"][0])
    nbytes = int(np.prod(shape)) * dtype.itemsize
    strides = cai.get("strides")
    c_strides = tuple(int(np.prod(shape[i + 1:])) * dtype.itemsize for i in range(len(shape)))
    f_strides = tuple(int(np.prod(shape[:i])) * dtype.itemsize for i in range(len(shape)))
    if strides is None or _same_strides(shape, strides, c_strides):
        layout = "C"
    elif _same_strides(shape, strides, f_strides):
        layout = "F"
    else:
        layout = None
    return pointer, nbytes, dtype, shape, layout


def _same_strides(shape, strides, wanted):
    """Strides equal where they matter (a dimension of 1 has no meaningful stride)."""
    return all(n == 1 or s == w for n, s, w in zip(shape, strides, wanted))


_libcuda = None


def _address_range(pointer):
    """(base, size) of the CUDA allocation holding `pointer`
    (cuMemGetAddressRange, with the pointer's device current)."""
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _libcuda.cuMemGetAddressRange_v2.argtypes = [
            ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        _libcuda.cuMemGetAddressRange_v2.restype = ctypes.c_int
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    result = _libcuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer)
    if result != 0:
        raise RuntimeError("dgmm: cuMemGetAddressRange failed with CUresult %d for 0x%x"
                           % (result, pointer))
    return base.value, size.value


class CudaIpcRegion(_Region):
    """GPU memory of an array with __cuda_array_interface__ (CuPy, PyTorch,
    Numba), exported with CUDA IPC so that the server runs jobs on it in place.

    The region is the array's bytes: the handle is cudaIpcGetMemHandle of the
    allocation that holds them (a memory pool hands out parts of larger
    allocations) and the offset is the array's distance from that base. The
    region keeps a reference to the array: its memory must not be freed while
    the server may use it.

    Args:
      array: a dense (C- or Fortran-contiguous) CUDA array.
      device: the GPU's ordinal as the *server* numbers its devices
        (GetServerInfo devices[].index). Default: this process's ordinal,
        right when both processes see the same GPUs in the same order (the
        same CUDA_VISIBLE_DEVICES, or none).

    Needs CuPy (imported here, not before) for the handle.
    """

    kind = pb.REGION_KIND_CUDA_IPC

    def __init__(self, array, device=None):
        super().__init__()
        import cupy  # Lazily: only IPC users need CuPy.

        pointer, nbytes, _, _, _ = _cuda_interface(array)
        if nbytes <= 0:
            raise ValueError("dgmm: an empty CUDA array cannot be a region")
        attributes = cupy.cuda.runtime.pointerGetAttributes(pointer)
        local_device = int(attributes.device)
        with cupy.cuda.Device(local_device):
            base, allocation_size = _address_range(pointer)
            self.handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(base))
        self.array = array
        self.address = pointer
        self.byte_size = nbytes
        self.offset = pointer - base
        self.allocation_size = allocation_size
        self.local_device = local_device
        self.device = local_device if device is None else int(device)

    def _register_request(self, name, session, timeout):
        return pb.RegisterRegionRequest(
            name=name, cuda_ipc=pb.CudaIpcRegion(handle=self.handle, device=self.device,
                                                 offset=self.offset, byte_size=self.byte_size))

    def _span(self):
        return self.address, self.byte_size

    def close(self, timeout=None):
        """Unregisters (errors ignored) and drops the reference to the array."""
        if self.client is not None:
            try:
                self.unregister(timeout=timeout)
            except DgmmError:
                pass
        self.array = None


# ------------------------------------------------------------------- jobs


def _host_interface(array):
    """(pointer, nbytes, dtype, shape, layout) of a NumPy array."""
    pointer = array.__array_interface__["data"][0]
    if array.flags.c_contiguous:
        layout = "C"
    elif array.flags.f_contiguous:
        layout = "F"
    else:
        layout = None
    return pointer, array.nbytes, array.dtype, array.shape, layout


def _describe(array):
    """("cuda" or "host", interface tuple)."""
    if hasattr(array, "__cuda_array_interface__"):
        return "cuda", _cuda_interface(array)
    if isinstance(array, np.ndarray):
        return "host", _host_interface(array)
    raise TypeError("dgmm: a region job takes NumPy views of a SharedMemoryRegion or CUDA "
                    "arrays of a CudaIpcRegion, got %s" % type(array).__name__)


def _find_ref(client, where, pointer, nbytes):
    """The RegionRef of registered memory holding [pointer, pointer + nbytes), or None."""
    kind = pb.REGION_KIND_CUDA_IPC if where == "cuda" else pb.REGION_KIND_SYSTEM_SHM
    for region in _registered(client):
        if region.kind != kind:
            continue
        offset = region._locate(pointer, nbytes)
        if offset is not None:
            return pb.RegionRef(name=region.name, offset=offset)
    return None


class RegionMethods:
    """Region calls of dgmm.Client: they use the client's own grpcio channel
    (Client._stub), token and credentials. This module depends on
    dgmm.client, not the other way round: it adds these methods to
    dgmm.Client when the package is imported (see the end of the file)."""

    def multiply_region(self, a, d, out, side="right", backend="auto", timeout=None):
        """Runs C = A·diag(d) (side="right"), diag(d)·A (side="left") or, with
        side="both" and d a pair (l, r), diag(l)·A·diag(r), on registered
        memory and returns the job's dgmm.pb.JobStats.

        a, out: arrays in regions registered with this client, of one kind:
          NumPy views of SharedMemoryRegions (SharedMemoryRegion.ndarray), or
          CUDA arrays of CudaIpcRegions. 2-D, float16, float32, float64,
          complex64 or complex128 (bfloat16 with ml_dtypes), C- or
          Fortran-contiguous; out has a's shape and order and the result
          dtype: NumPy's result_type of a and d (dgmm.result_dtype; a's
          dtype unless d's is wider or complex). out may be a itself (in
          place) when the result has a's dtype; any other overlap is
          INVALID_ARGUMENT.
        d: 1-D (side="both": each of l and r, sent in their result type);
          of one of the six dtypes above it is sent as it is (the server
          promotes), of another (integers, ...) converted to a's dtype. Read
          by the server from a registered shared-memory region when it lies
          in one (for side="both": when both do), else sent inline (a CUDA
          array is copied to the host first: the server takes no diagonal
          from IPC regions).
        timeout: seconds; None for no deadline. Not retried.

        Raises ValueError for arrays that cannot be a region job (not in a
        registered region, wrong dtype, not contiguous, shapes differ) and
        DgmmError when the server refuses or fails the job.
        """
        where, (a_ptr, a_bytes, dtype, shape, layout) = _describe(a)
        if len(shape) != 2:
            raise ValueError("dgmm: A must be 2-D, got shape %s" % (shape,))
        if dtype not in _DTYPES:
            raise ValueError("dgmm: A must be little-endian float16, float32, float64, complex64, "
                             "complex128 (or ml_dtypes.bfloat16), got %s" % dtype)
        if layout is None:
            raise ValueError("dgmm: A must be C- or Fortran-contiguous to be a region job")
        # The diagonals' dtype on the wire (side="both": their result type)
        # and C's: NumPy's result_type of A and d.
        sides = d if isinstance(d, (tuple, list)) else (d,)
        d_enum = None
        for each in sides:
            each_dtype = _np_dtype_of(each)
            if each_dtype.byteorder == ">":
                each_dtype = each_dtype.newbyteorder("<")
            each_enum = _DTYPES.get(each_dtype, _DTYPES[dtype])
            d_enum = each_enum if d_enum is None else _promote(d_enum, each_enum)
        d_enum = _DTYPES[dtype] if d_enum is None else d_enum
        d_dtype = next(t for t, e in _DTYPES.items() if e == d_enum)
        c_dtype = next(t for t, e in _DTYPES.items() if e == _promote(_DTYPES[dtype], d_enum))
        out_where, (o_ptr, o_bytes, o_dtype, o_shape, o_layout) = _describe(out)
        if (out_where, o_dtype, o_shape, o_layout) != (where, c_dtype, shape, layout):
            raise ValueError("dgmm: out must have A's kind, shape and order and the result's "
                             "dtype (%s %s %s %s), got %s %s %s %s"
                             % (where, shape, c_dtype, layout, out_where, o_shape, o_dtype,
                                o_layout))
        # The session first: one the server closed forgets its regions, so
        # that a stale name never reaches the server (where another region of
        # this uid may have it now).
        session = _session(self, timeout)
        matrix = _find_ref(self, where, a_ptr, a_bytes)
        result = _find_ref(self, where, o_ptr, o_bytes)
        for what, ref in (("A", matrix), ("out", result)):
            if ref is None:
                lost = getattr(self, "_regions_lost", None)
                raise ValueError(
                    "dgmm: %s is not in a region registered with this client%s" % (what, (
                        " (the server closed this client's local session -- it exited or "
                        "restarted -- and dropped its regions %s: register them again)"
                        % ", ".join(lost)) if lost else ""))
        rows, cols = shape
        # A vector is C-contiguous too (see _host_interface): "F" means a true matrix.
        header = pb.JobHeader(
            rows=rows, cols=cols, dtype=_DTYPES[dtype],
            layout=pb.LAYOUT_COL_MAJOR if layout == "F" else pb.LAYOUT_ROW_MAJOR,
            side=_enum_value(side, _ALL_SIDES, "side"),
            backend=backend_value(backend),
            diagonal_dtype=d_enum if d_dtype != dtype else 0)
        refs = ()
        if header.side == pb.SIDE_BOTH:
            if not isinstance(d, (tuple, list)) or len(d) != 2:
                raise ValueError("dgmm: side='both' takes the diagonals as a pair (l, r)")
            left = self._region_diagonal(where, d[0], d_dtype, pb.JobHeader())
            right = self._region_diagonal(where, d[1], d_dtype, pb.JobHeader())
            if left is not None and right is not None:
                refs = (("diagonal", left), ("right_diagonal", right))
            else:  # both inline
                for which, field in ((d[0], "diagonal"), (d[1], "right_diagonal")):
                    scratch = pb.JobHeader()
                    self._region_diagonal(where, which, d_dtype, scratch, inline=True)
                    setattr(header, field, scratch.diagonal)
        else:
            diagonal = self._region_diagonal(where, d, d_dtype, header)
            if diagonal is not None:
                refs = (("diagonal", diagonal),)
        # The header is copied into the request: made complete first.
        request = pb.MultiplyRegionRequest(header=header, matrix=matrix, result=result)
        for field, ref in refs:
            getattr(request, field).CopyFrom(ref)
        return _call(self, "MultiplyRegion", request, timeout, session).stats

    def _region_diagonal(self, where, d, dtype, header, inline=False):
        """The diagonal's RegionRef when it lies in a registered shared-memory
        region with the job's dtype (and not `inline`); else None, with
        header.diagonal set (a CUDA diagonal is copied to the host: the
        server reads diagonals only inline or from host regions)."""
        if hasattr(d, "__cuda_array_interface__"):
            import cupy
            d = cupy.asnumpy(d)
        elif not inline and isinstance(d, np.ndarray) and where == "host" and d.dtype == dtype and (
                d.ndim == 1 and d.flags.c_contiguous):
            ref = _find_ref(self, "host", d.__array_interface__["data"][0], d.nbytes)
            if ref is not None:
                return ref
        d = np.asarray(d)
        if d.ndim != 1:
            raise ValueError("dgmm: the diagonal must be 1-D, got shape %s" % (d.shape,))
        if d.dtype.kind not in ("biufc" if dtype.kind == "c" else "biuf") and d.dtype != dtype:
            raise ValueError("dgmm: the diagonal must be %s numbers, got %s"
                             % ("complex or real" if dtype.kind == "c" else "real", d.dtype))
        header.diagonal = np.ascontiguousarray(d, dtype=dtype).tobytes()
        return None

    def multiply_region_refs(self, header, matrix, result, diagonal=None, timeout=None,
                             right_diagonal=None):
        """The raw call: a dgmm.pb.JobHeader and dgmm.pb.RegionRefs
        (region.ref(offset), or any region of this uid by name; SIDE_BOTH's
        right diagonal as `right_diagonal`); returns dgmm.pb.JobStats."""
        request = pb.MultiplyRegionRequest(header=header, matrix=matrix, result=result)
        if diagonal is not None:
            request.diagonal.CopyFrom(diagonal)
        if right_diagonal is not None:
            request.right_diagonal.CopyFrom(right_diagonal)
        return _call(self, "MultiplyRegion", request, timeout, _session(self, timeout)).stats

    def region_status(self, name="", timeout=None):
        """dgmm.pb.GetRegionStatusResponse: the regions of this uid (and
        token) on the server -- every Client's and process's, not only this
        one's -- or the one named, and the bytes all clients have registered
        against the budget."""
        return _call(self, "GetRegionStatus", pb.GetRegionStatusRequest(name=name), timeout,
                     _session(self, timeout))

    def unregister_regions(self, timeout=None, all_of_owner=False):
        """Unregisters the regions registered through this client; returns
        how many the server still had. all_of_owner=True: every region of
        this uid (and token) on the server, other Clients' and processes'
        too (UnregisterRegion with an empty name)."""
        session = _session(self, timeout)
        with _REGISTRY_LOCK:
            regions = list(_REGISTRY.pop(self, {}).values())
        if all_of_owner:
            for region in regions:
                region.client = region.name = region._session = None
            return _call(self, "UnregisterRegion", pb.UnregisterRegionRequest(name=""),
                         timeout, session).unregistered
        return sum(1 for region in regions if region.unregister(timeout))

    def local_session(self, timeout=None):
        """This client's dgmm.regions.LocalSession on the server's local
        socket (opened now if it is not open yet): the session region calls
        carry, and this process's uid, gid and pid as the server saw them."""
        return _session(self, timeout)



# dgmm.Client gets the region calls (dgmm/__init__.py imports this module).
for _name in ("multiply_region", "_region_diagonal", "multiply_region_refs", "region_status",
              "unregister_regions", "local_session"):
    setattr(Client, _name, getattr(RegionMethods, _name))
del _name
