// The one place internal absl::Status values become gRPC statuses.
#ifndef DGMM_SERVICE_RPC_STATUS_MAP_H_
#define DGMM_SERVICE_RPC_STATUS_MAP_H_

#include <cstdint>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "service/util/retry_pushback.h"

namespace dgmm {

// Converts `s` (same code, same message); adds the retry hint `s` carries
// (WithRetryPushback, service/util/retry_pushback.h) to `context` as the
// `grpc-retry-pushback-ms` trailer.
grpc::Status ToGrpcStatus(const absl::Status& s, grpc::ServerContextBase* context);

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_STATUS_MAP_H_
