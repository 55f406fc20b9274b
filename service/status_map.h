// The one place internal absl::Status values become gRPC statuses.
#ifndef DGMM_SERVICE_STATUS_MAP_H_
#define DGMM_SERVICE_STATUS_MAP_H_

#include <cstdint>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace dgmm {

// Attaches a retry hint to a status (queue full): the client should wait this
// long before retrying. Sent as `grpc-retry-pushback-ms` trailing metadata.
absl::Status WithRetryPushback(absl::Status s, int64_t ms);

// Converts `s` (same code, same message); adds the retry-pushback trailer to
// `context` when `s` carries one.
grpc::Status ToGrpcStatus(const absl::Status& s, grpc::ServerContextBase* context);

}  // namespace dgmm

#endif  // DGMM_SERVICE_STATUS_MAP_H_
