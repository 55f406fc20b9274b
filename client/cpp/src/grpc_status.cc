#include "dgmm/grpc_status.h"

namespace dgmm {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  const bool canonical = code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated);
  return absl::Status(canonical ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown,
                      status.error_message());
}

}  // namespace dgmm
