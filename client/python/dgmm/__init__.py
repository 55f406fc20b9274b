"""dgmm: Python client for the dgmm service (C = A·diag(d) or diag(d)·A).

    import numpy as np, dgmm
    with dgmm.Client("127.0.0.1:50051") as client:
        c = client.multiply(np.ones((3, 4)), np.arange(4.0))          # A·diag(d)
        c = client.multiply(np.ones((3, 4)), np.arange(3.0), side="left")

The gRPC stubs are generated from proto/dgmm/v1/dgmm.proto on first import
when the build has not generated them (see dgmm/_stubs.py).
"""

import os as _os

from . import _stubs

# protoc names the generated module `dgmm.v1.dgmm_pb2`; make `dgmm.v1` resolve
# to <stub dir>/dgmm/v1 by adding that tree to this package's search path.
__path__.append(_os.path.join(_stubs.ensure_stubs(), "dgmm"))  # noqa: F821

from .v1 import dgmm_pb2 as pb  # noqa: E402
from .v1 import dgmm_pb2_grpc as pb_grpc  # noqa: E402
from .client import Client, DgmmError, InvalidArgumentError, MultiplyInfo, RetryPolicy  # noqa: E402,E501
from .regions import CudaIpcRegion, SharedMemoryRegion  # noqa: E402

__all__ = ["Client", "CudaIpcRegion", "DgmmError", "InvalidArgumentError", "MultiplyInfo",
           "RetryPolicy", "SharedMemoryRegion", "pb", "pb_grpc"]
__version__ = "0.1.0"
