// Block buffers on the wire: hands a HostBuffer to gRPC as a slice that owns
// it. Kept out of host_buffers.h so that the buffers, and the GPU backend
// that lends them, compile without gRPC.
#ifndef DGMM_SERVICE_RPC_WIRE_BUFFERS_H_
#define DGMM_SERVICE_RPC_WIRE_BUFFERS_H_

#include <grpcpp/support/slice.h>

#include <cstddef>

#include "service/core/host_buffers.h"

namespace dgmm {

// A slice over the first `bytes` bytes of `buffer` that owns it: the buffer
// goes back to its pool when gRPC releases the last reference.
grpc::Slice ToSlice(HostBuffer buffer, size_t bytes);

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_WIRE_BUFFERS_H_
