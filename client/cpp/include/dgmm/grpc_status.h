// Conversion of gRPC call results to absl::Status.
#ifndef DGMM_CLIENT_CPP_INCLUDE_DGMM_GRPC_STATUS_H_
#define DGMM_CLIENT_CPP_INCLUDE_DGMM_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dgmm {

// Returns an absl::Status with the same canonical code as `status` and its
// error message (gRPC and Abseil share the canonical code numbers; a code
// outside them becomes UNKNOWN). OK maps to OK.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_INCLUDE_DGMM_GRPC_STATUS_H_
