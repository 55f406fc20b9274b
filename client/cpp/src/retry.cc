#include "src/retry.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dgmm {

namespace {
constexpr char kWaitSpentPayload[] = "type.dgmm.dev/dgmm.client.reconnect-wait-spent";
}  // namespace

void MarkReconnectWaitSpent(absl::Status* status) {
  status->SetPayload(kWaitSpentPayload, absl::Cord("1"));
}

bool ReconnectWaitSpent(const absl::Status& status) {
  return status.GetPayload(kWaitSpentPayload).has_value();
}
namespace {

constexpr char kPushbackTrailer[] = "grpc-retry-pushback-ms";
constexpr double kJitterFraction = 0.2;

absl::Duration Backoff(const RetryPolicy& policy, int attempts_made, double jitter) {
  const double growth = std::pow(policy.backoff_multiplier, attempts_made - 1);
  const absl::Duration base = std::min(policy.initial_backoff * growth, policy.max_backoff);
  return base * (1.0 + kJitterFraction * std::clamp(jitter, -1.0, 1.0));
}

}  // namespace

FailureOrigin FailureOriginOf(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  const auto found = trailers.find(kOriginTrailer);
  if (found != trailers.end() &&
      absl::string_view(found->second.data(), found->second.size()) == kOriginServer) {
    return FailureOrigin::kServer;
  }
  return FailureOrigin::kTransport;
}

std::optional<absl::Duration> RetryPushback(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  const auto found = trailers.find(kPushbackTrailer);
  if (found == trailers.end()) return std::nullopt;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(absl::string_view(found->second.data(), found->second.size()), &ms) ||
      ms < 0) {
    return std::nullopt;
  }
  return absl::Milliseconds(ms);
}

std::optional<absl::Duration> RetryDelay(const RetryPolicy& policy, int attempts_made,
                                         absl::StatusCode code, FailureOrigin origin,
                                         std::optional<absl::Duration> pushback, absl::Time now,
                                         absl::Time deadline, double jitter) {
  if (attempts_made >= policy.max_attempts) return std::nullopt;
  const bool transport = origin == FailureOrigin::kTransport;
  std::optional<absl::Duration> wait;
  switch (code) {
    case absl::StatusCode::kUnavailable:
      wait = Backoff(policy, attempts_made, jitter);
      break;
    case absl::StatusCode::kResourceExhausted:
      // The server's queue was full: its hint. Without one, dgmm's own
      // RESOURCE_EXHAUSTED is a job that can never fit (final), and the
      // transport's is its memory quota, full for now.
      if (pushback.has_value()) {
        wait = pushback;
      } else if (transport) {
        wait = Backoff(policy, attempts_made, jitter);
      }
      break;
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      // The transport's: a stream reset or a broken proxy. dgmm's own INTERNAL
      // (a CUDA error) is final.
      if (transport) wait = Backoff(policy, attempts_made, jitter);
      break;
    default:
      // CANCELLED (the caller's decision), DEADLINE_EXCEEDED (the one
      // deadline is spent) and every verdict on the request: final.
      break;
  }
  if (!wait.has_value() || now + *wait >= deadline) return std::nullopt;
  return wait;
}

double RandomJitter() {
  thread_local std::mt19937 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(-1.0, 1.0)(rng);
}

constexpr char kRetryAfterPayload[] = "type.dgmm.dev/dgmm.client.retry_after_ms";

void SetRetryAfter(absl::Status* status, absl::Duration pushback) {
  status->SetPayload(kRetryAfterPayload,
                     absl::Cord(absl::StrCat(absl::ToInt64Milliseconds(pushback))));
}

std::optional<int64_t> RetryAfterMsOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kRetryAfterPayload);
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms)) return std::nullopt;
  return ms;
}

}  // namespace dgmm
