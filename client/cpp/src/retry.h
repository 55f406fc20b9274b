// When a failed job is tried again (the rules are in RetryPolicy's comment in
// dgmm/client.h). Not part of the public API.
#ifndef DGMM_CLIENT_CPP_SRC_RETRY_H_
#define DGMM_CLIENT_CPP_SRC_RETRY_H_

#include <grpcpp/client_context.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dgmm/client.h"

namespace dgmm {

// The server's `grpc-retry-pushback-ms` trailer of a finished call, or
// nullopt when there is none or it is not a non-negative number of ms.
std::optional<absl::Duration> RetryPushback(const grpc::ClientContext& context);

// How long to wait before attempt number `attempts_made + 1` of a job whose
// attempt `attempts_made` (1-based) failed with `failure`, or nullopt when the
// job must not be retried: a code the policy does not retry, no attempts left,
// or a wait that would end after `deadline`. `pushback` is the failed call's
// RetryPushback; `jitter` in [-1, 1] moves a backoff wait by up to 20%.
std::optional<absl::Duration> RetryDelay(const RetryPolicy& policy, int attempts_made,
                                         const absl::Status& failure,
                                         std::optional<absl::Duration> pushback, absl::Time now,
                                         absl::Time deadline, double jitter);

// A random jitter for RetryDelay, uniform in [-1, 1].
double RandomJitter();

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_SRC_RETRY_H_
