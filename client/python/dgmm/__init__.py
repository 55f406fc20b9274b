"""dgmm: Python client for the dgmm service (C = A·diag(d) or diag(d)·A).

    import numpy as np, dgmm
    with dgmm.Client("127.0.0.1:50051") as client:
        c = client.multiply(np.ones((3, 4)), np.arange(4.0))          # A·diag(d)
        c = client.multiply(np.ones((3, 4)), np.arange(3.0), side="left")

Jobs run in the C++ client (dgmm._core, built with the package); the gRPC
stubs (dgmm.v1) were generated when the package was built. asyncio:
dgmm.aio.Client.
"""

from .v1 import dgmm_pb2 as pb
from .v1 import dgmm_pb2_grpc as pb_grpc
from .client import Client, DgmmError, InvalidArgumentError, MultiplyInfo, RetryPolicy
from .regions import CudaIpcRegion, SharedMemoryRegion

__all__ = ["Client", "CudaIpcRegion", "DgmmError", "InvalidArgumentError", "MultiplyInfo",
           "RetryPolicy", "SharedMemoryRegion", "pb", "pb_grpc"]
__version__ = "0.1.0"
