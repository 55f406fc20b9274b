// The one place internal absl::Status values become gRPC statuses.
#ifndef DGMM_SERVICE_RPC_STATUS_MAP_H_
#define DGMM_SERVICE_RPC_STATUS_MAP_H_

#include <cstdint>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "service/core/retry_pushback.h"

namespace dgmm {

// Converts `s` (same code, same message); adds the retry hint `s` carries
// (WithRetryPushback, service/core/retry_pushback.h) to `context` as the
// `grpc-retry-pushback-ms` trailer, and marks every error as dgmm's own with
// the trailer `dgmm-origin: server` (docs/protocol.md §9, rule 3): a client
// retries an error without it (INTERNAL from an RST_STREAM, RESOURCE_EXHAUSTED
// from gRPC's transport quota) as a transport failure, and takes dgmm's own
// INTERNAL or too-large RESOURCE_EXHAUSTED as final.
inline constexpr char kOriginTrailer[] = "dgmm-origin";
inline constexpr char kOriginServer[] = "server";
grpc::Status ToGrpcStatus(const absl::Status& s, grpc::ServerContextBase* context);

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_STATUS_MAP_H_
