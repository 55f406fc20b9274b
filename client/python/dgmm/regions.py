"""dgmm.regions: the same-host data plane (docs/protocol.md "Regions").

A client on the server's host puts its matrix in memory the server can reach,
registers that memory once under a name, and then runs jobs whose matrix,
result and (optionally) diagonal live there: the request and the response
carry only the header and the stats, no matrix bytes.

Host memory: a POSIX shared-memory object, shared between this process and
the server. NumPy arrays are views of its mapping.

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

The server must run with --allow_regions (GetServerInfo's
limits.regions_enabled says so) and be on this host: for another host the
shared-memory object does not exist there (NOT_FOUND at registration);
stream instead. Region calls are never retried: a job in place must not run
twice. Closing a region (or leaving its `with`) unregisters it, unmaps it
and, for shared memory, unlinks the object, so nothing outlives the process.
"""

import ctypes
import mmap
import os
import re
import secrets
import threading
import weakref

import grpc
import numpy as np

from .client import _SIDES, Client, DgmmError, _enum_value, backend_value
from .v1 import dgmm_pb2 as pb

_KEY = re.compile(r"/[A-Za-z0-9._-]{1,200}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SHM_DIR = "/dev/shm"
_DTYPES = {np.dtype("<f4"): pb.DTYPE_FLOAT32, np.dtype("<f8"): pb.DTYPE_FLOAT64}
_TYPESTRS = {"<f4": np.dtype("<f4"), "<f8": np.dtype("<f8")}


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


def _call(client, method, request, timeout):
    """One region RPC on the client's own channel, DgmmError on failure."""
    try:
        return getattr(client._stub, method)(request, timeout=timeout,
                                              metadata=client._metadata)
    except grpc.RpcError as e:
        raise DgmmError.from_rpc_error(e) from None


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

    # Subclasses: _register_request(name) -> RegisterRegionRequest, and
    # _span() -> (first address, byte size) of the registered memory.

    @property
    def registered(self):
        return self.client is not None

    def register(self, client, name, timeout=None):
        """Registers the region with `client` under `name` (1-64 of
        [A-Za-z0-9._-], unique among this client's regions). Returns self;
        self.status is the server's RegionStatus (register_ns: what mapping
        and pinning cost, once)."""
        _check_name(name)
        if self.client is not None:
            raise ValueError("dgmm: region is already registered as %r; unregister it first"
                             % self.name)
        response = _call(client, "RegisterRegion", self._register_request(name), timeout)
        self.client, self.name, self.status = client, name, response.region
        with _REGISTRY_LOCK:
            _REGISTRY.setdefault(client, {})[name] = self
        return self

    def unregister(self, timeout=None):
        """Unregisters the region (a job using it finishes first). Returns
        whether the server still had it (False when, e.g., its idle timeout
        already dropped it)."""
        if self.client is None:
            return False
        client, name = self.client, self.name
        self.client = self.name = None
        with _REGISTRY_LOCK:
            regions = _REGISTRY.get(client, {})
            if regions.get(name) is self:
                del regions[name]
        try:
            response = _call(client, "UnregisterRegion", pb.UnregisterRegionRequest(name=name),
                             timeout)
        except DgmmError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
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
    """A POSIX shared-memory object this process creates, sizes and maps.

    Args:
      byte_size: bytes of the object (> 0).
      key: its shm_open name, "/" then 1-200 of [A-Za-z0-9._-]; default a
        fresh "/dgmm-py-<pid>-<random>". The object is created (it must not
        exist yet), owner read/write only.

    register(client, name, offset=0, byte_size=None) registers a range of it
    (default all of it). ndarray(...) gives NumPy views of the mapping. close()
    (or leaving `with`) unregisters, unmaps what no view still holds, and
    unlinks the object; the unlink also happens when the process exits, and a
    server drops a region whose object is unlinked once no job uses it.
    """

    kind = pb.REGION_KIND_SYSTEM_SHM

    def __init__(self, byte_size, key=None):
        super().__init__()
        byte_size = int(byte_size)
        if byte_size <= 0:
            raise ValueError("dgmm: a shared-memory region needs byte_size > 0")
        self.key = _check_key(key if key is not None else
                               "/dgmm-py-%d-%s" % (os.getpid(), secrets.token_hex(6)))
        self.byte_size = byte_size
        self.path = _SHM_DIR + self.key  # glibc's shm_open(key) opens exactly this file.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            self._unlink = weakref.finalize(self, _unlink_quietly, self.path)
            os.ftruncate(fd, byte_size)
            self._mmap = mmap.mmap(fd, byte_size, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            _unlink_quietly(self.path)
            raise
        finally:
            os.close(fd)
        self._bytes = np.frombuffer(self._mmap, dtype=np.uint8)  # Every view derives from it.
        self.address = self._bytes.__array_interface__["data"][0]
        self._range = (0, byte_size)

    def register(self, client, name, offset=0, byte_size=None, timeout=None):
        """Registers bytes [offset, offset + byte_size) of the object (default:
        all of it) with `client` under `name`; see _Region.register."""
        offset = int(offset)
        size = self.byte_size - offset if byte_size is None else int(byte_size)
        self._range = (offset, size)
        return super().register(client, name, timeout)

    def _register_request(self, name):
        offset, size = self._range
        return pb.RegisterRegionRequest(
            name=name, system_shm=pb.SystemShmRegion(key=self.key, offset=offset, byte_size=size))

    def _span(self):
        offset, size = self._range
        return self.address + offset, size

    @property
    def buffer(self):
        """The whole mapping as a writable uint8 NumPy array."""
        self._check_open()
        return self._bytes

    def ndarray(self, shape, dtype=np.float64, offset=0, order="C"):
        """A NumPy array of `shape` and `dtype` (float32 or float64 for jobs)
        that is a view of the mapping, `offset` bytes from the object's start,
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
        """Unregisters (errors are ignored: the server drops regions of
        unlinked objects by itself), unlinks the object and unmaps it. The
        mapping stays while NumPy views of it are alive."""
        if self.client is not None:
            try:
                self.unregister(timeout=timeout)
            except DgmmError:
                pass
        self._unlink()
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

    def _register_request(self, name):
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
        """Runs C = A·diag(d) (side="right") or diag(d)·A (side="left") on
        registered memory and returns the job's dgmm.pb.JobStats.

        a, out: arrays in regions registered with this client, of one kind:
          NumPy views of SharedMemoryRegions (SharedMemoryRegion.ndarray), or
          CUDA arrays of CudaIpcRegions. 2-D, float32 or float64, C- or
          Fortran-contiguous; out has a's shape, dtype and order. out may be
          a itself (in place); a partial overlap is INVALID_ARGUMENT.
        d: 1-D; read by the server from a registered shared-memory region
          when it lies in one and has a's dtype, else sent inline (converted
          to a's dtype; a CUDA array is copied to the host first: the server
          takes no diagonal from IPC regions).
        timeout: seconds; None for no deadline. Not retried.

        Raises ValueError for arrays that cannot be a region job (not in a
        registered region, wrong dtype, not contiguous, shapes differ) and
        DgmmError when the server refuses or fails the job.
        """
        where, (a_ptr, a_bytes, dtype, shape, layout) = _describe(a)
        if len(shape) != 2:
            raise ValueError("dgmm: A must be 2-D, got shape %s" % (shape,))
        if dtype not in _DTYPES:
            raise ValueError("dgmm: A must be little-endian float32 or float64, got %s" % dtype)
        if layout is None:
            raise ValueError("dgmm: A must be C- or Fortran-contiguous to be a region job")
        out_where, (o_ptr, o_bytes, o_dtype, o_shape, o_layout) = _describe(out)
        if (out_where, o_dtype, o_shape, o_layout) != (where, dtype, shape, layout):
            raise ValueError("dgmm: out must have A's kind, shape, dtype and order (%s %s %s "
                             "%s), got %s %s %s %s" % (where, shape, dtype, layout, out_where,
                                                        o_shape, o_dtype, o_layout))
        matrix = _find_ref(self, where, a_ptr, a_bytes)
        result = _find_ref(self, where, o_ptr, o_bytes)
        for what, ref in (("A", matrix), ("out", result)):
            if ref is None:
                raise ValueError("dgmm: %s is not in a region registered with this client"
                                 % what)
        rows, cols = shape
        # A vector is C-contiguous too (see _host_interface): "F" means a true matrix.
        header = pb.JobHeader(
            rows=rows, cols=cols, dtype=_DTYPES[dtype],
            layout=pb.LAYOUT_COL_MAJOR if layout == "F" else pb.LAYOUT_ROW_MAJOR,
            side=_enum_value(side, _SIDES, "side"),
            backend=backend_value(backend))
        diagonal = self._region_diagonal(where, d, dtype, header)
        request = pb.MultiplyRegionRequest(header=header, matrix=matrix, result=result)
        if diagonal is not None:
            request.diagonal.CopyFrom(diagonal)
        return _call(self, "MultiplyRegion", request, timeout).stats

    def _region_diagonal(self, where, d, dtype, header):
        """The diagonal's RegionRef when it lies in a registered shared-memory
        region with the job's dtype; else None, with header.diagonal set (a
        CUDA diagonal is copied to the host: the server reads diagonals only
        inline or from host regions)."""
        if hasattr(d, "__cuda_array_interface__"):
            import cupy
            d = cupy.asnumpy(d)
        elif isinstance(d, np.ndarray) and where == "host" and d.dtype == dtype and (
                d.ndim == 1 and d.flags.c_contiguous):
            ref = _find_ref(self, "host", d.__array_interface__["data"][0], d.nbytes)
            if ref is not None:
                return ref
        d = np.asarray(d)
        if d.ndim != 1:
            raise ValueError("dgmm: the diagonal must be 1-D, got shape %s" % (d.shape,))
        if d.dtype.kind not in "biuf":
            raise ValueError("dgmm: the diagonal must be real numbers, got %s" % d.dtype)
        header.diagonal = np.ascontiguousarray(d, dtype=dtype).tobytes()
        return None

    def multiply_region_refs(self, header, matrix, result, diagonal=None, timeout=None):
        """The raw call: a dgmm.pb.JobHeader and dgmm.pb.RegionRefs
        (region.ref(offset)); returns dgmm.pb.JobStats."""
        request = pb.MultiplyRegionRequest(header=header, matrix=matrix, result=result)
        if diagonal is not None:
            request.diagonal.CopyFrom(diagonal)
        return _call(self, "MultiplyRegion", request, timeout).stats

    def region_status(self, name="", timeout=None):
        """dgmm.pb.GetRegionStatusResponse: this client's regions (or the one
        named), and the bytes all clients have registered against the budget."""
        return _call(self, "GetRegionStatus", pb.GetRegionStatusRequest(name=name), timeout)

    def unregister_regions(self, timeout=None):
        """Unregisters every region of this client on the server (also ones
        registered by other Client objects with the same token or address);
        returns how many there were."""
        with _REGISTRY_LOCK:
            regions = list(_REGISTRY.pop(self, {}).values())
        for region in regions:
            region.client = region.name = None
        return _call(self, "UnregisterRegion", pb.UnregisterRegionRequest(name=""),
                     timeout).unregistered



# dgmm.Client gets the region calls (dgmm/__init__.py imports this module).
for _name in ("multiply_region", "_region_diagonal", "multiply_region_refs", "region_status",
              "unregister_regions"):
    setattr(Client, _name, getattr(RegionMethods, _name))
del _name
