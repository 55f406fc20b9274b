"""dgmm: Python client for the dgmm service (C = A·diag(d) or diag(d)·A).

    import numpy as np, dgmm
    with dgmm.Client("127.0.0.1:50051") as client:
        c = client.multiply(np.ones((3, 4)), np.arange(4.0))          # A·diag(d)
        c = client.multiply(np.ones((3, 4)), np.arange(3.0), side="left")

Jobs run in the C++ client (dgmm._core, built with the package); the gRPC
stubs (dgmm.v1) were generated when the package was built. asyncio:
dgmm.aio.Client. On the server's host (--allow_regions), matrices of 1 MiB
and more go through shared memory by default (info.mode "shm"), and
dgmm.empty / zeros / asarray make arrays that live in memory the server
maps, so that jobs on them copy nothing (dgmm.arrays).
"""

import os as _os

if not _os.path.isdir(_os.path.join(__path__[0], "v1")):  # noqa: F821
    # The source tree (PYTHONPATH=client/python), not an installed package:
    # the extension and stubs are in a build tree's staged copy,
    # $DGMM_PY_STAGE (or $DGMM_PY_PROTO_DIR), else <repo>/build/python.
    _stage = (_os.environ.get("DGMM_PY_STAGE") or _os.environ.get("DGMM_PY_PROTO_DIR") or
              _os.path.join(__path__[0], "..", "..", "..", "build", "python"))  # noqa: F821
    __path__.append(_os.path.join(_os.path.abspath(_stage), "dgmm"))  # noqa: F821

from .v1 import dgmm_pb2 as pb  # noqa: E402
from .v1 import dgmm_pb2_grpc as pb_grpc  # noqa: E402
from .client import Client, DgmmError, InvalidArgumentError, MultiplyInfo, RetryPolicy, result_dtype  # noqa: E402,E501
from .regions import CudaIpcRegion, SharedMemoryRegion  # noqa: E402
from .arrays import asarray, empty, empty_like, region_of, zeros  # noqa: E402

__all__ = ["Client", "CudaIpcRegion", "DgmmError", "InvalidArgumentError", "MultiplyInfo",
           "RetryPolicy", "SharedMemoryRegion", "asarray", "empty", "empty_like", "pb", "pb_grpc",
           "region_of", "result_dtype", "zeros"]
__version__ = "0.1.0"
