#include "service/status_map.h"

#include <string>

#include "absl/strings/cord.h"

namespace dgmm {
namespace {
constexpr char kPushbackPayload[] = "dgmm/retry-pushback-ms";
}

absl::Status WithRetryPushback(absl::Status s, int64_t ms) {
  s.SetPayload(kPushbackPayload, absl::Cord(std::to_string(ms)));
  return s;
}

grpc::Status ToGrpcStatus(const absl::Status& s, grpc::ServerContextBase* context) {
  if (s.ok()) return grpc::Status::OK;
  if (auto pushback = s.GetPayload(kPushbackPayload); pushback && context != nullptr) {
    context->AddTrailingMetadata("grpc-retry-pushback-ms", std::string(*pushback));
  }
  // absl::StatusCode and grpc::StatusCode share their numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace dgmm
