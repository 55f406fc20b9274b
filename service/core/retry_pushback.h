// A retry hint carried by an internal absl::Status (a full queue): how long
// the client should wait before it tries again. gRPC-free, so that admission
// can attach it; status_map.h turns it into the `grpc-retry-pushback-ms`
// trailer.
#ifndef DGMM_SERVICE_CORE_RETRY_PUSHBACK_H_
#define DGMM_SERVICE_CORE_RETRY_PUSHBACK_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace dgmm {

// The status payload that carries the hint (milliseconds, in decimal).
inline constexpr absl::string_view kRetryPushbackPayload = "dgmm/retry-pushback-ms";

// Returns `s` with a retry hint of `ms` milliseconds attached.
inline absl::Status WithRetryPushback(absl::Status s, int64_t ms) {
  s.SetPayload(kRetryPushbackPayload, absl::Cord(std::to_string(ms)));
  return s;
}

// The hint attached to `s`, if any.
inline std::optional<int64_t> RetryPushbackMs(const absl::Status& s) {
  const auto payload = s.GetPayload(kRetryPushbackPayload);  // an absl::optional here
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms)) return std::nullopt;
  return ms;
}

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_RETRY_PUSHBACK_H_
