#include "service/rpc/status_map.h"

#include <string>

namespace dgmm {

grpc::Status ToGrpcStatus(const absl::Status& s, grpc::ServerContextBase* context) {
  if (s.ok()) return grpc::Status::OK;
  if (context != nullptr) {
    context->AddTrailingMetadata(kOriginTrailer, kOriginServer);
    if (auto pushback = RetryPushbackMs(s); pushback.has_value()) {
      context->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(*pushback));
    }
  }
  // absl::StatusCode and grpc::StatusCode share their numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace dgmm
