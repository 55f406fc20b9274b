// When a failed job is tried again (the rules are in RetryPolicy's comment in
// dgmm/client.h and docs/protocol.md §9, rule 3). Not part of the public API.
#ifndef DGMM_CLIENT_CPP_SRC_RETRY_H_
#define DGMM_CLIENT_CPP_SRC_RETRY_H_

#include <grpcpp/client_context.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dgmm/client.h"

namespace dgmm {

// A wait for a connection that ran out its RetryPolicy.max_reconnect_wait
// marks its UNAVAILABLE status, so that the job does not wait that long again
// on another path (a same-host job that found no connection does not fall
// back to the socket, where it would wait once more).
void MarkReconnectWaitSpent(absl::Status* status);
bool ReconnectWaitSpent(const absl::Status& status);

// Who ended a failed call. A dgmm server marks every error status it makes
// with the trailing metadata `dgmm-origin: server`; a status without it was
// made by gRPC or the network: an RST_STREAM (INTERNAL "Received RST_STREAM
// with error code 1"), a transport's memory quota (RESOURCE_EXHAUSTED), a
// connection lost or refused (UNAVAILABLE), a broken proxy (UNKNOWN).
enum class FailureOrigin { kServer, kTransport };

// The trailer that marks dgmm's own errors, and its value.
inline constexpr char kOriginTrailer[] = "dgmm-origin";
inline constexpr char kOriginServer[] = "server";

// kServer when the finished call's trailing metadata has `dgmm-origin:
// server`, else kTransport.
FailureOrigin FailureOriginOf(const grpc::ClientContext& context);

// The server's `grpc-retry-pushback-ms` trailer of a finished call, or
// nullopt when there is none or it is not a non-negative number of ms.
std::optional<absl::Duration> RetryPushback(const grpc::ClientContext& context);

// Rule 3, as a pure function: how long to wait before attempt number
// `attempts_made + 1` of a job whose attempt `attempts_made` (1-based) failed
// with `code` from `origin`, or nullopt when the job must not be retried.
//  - UNAVAILABLE, from either origin: the backoff (initial_backoff, times
//    backoff_multiplier per attempt, at most max_backoff, moved by `jitter`
//    in [-1, 1] by up to 20%).
//  - RESOURCE_EXHAUSTED with a `pushback` (the grpc-retry-pushback-ms
//    trailer: the server's queue was full): that long.
//  - INTERNAL, RESOURCE_EXHAUSTED (without a pushback) and UNKNOWN from the
//    transport: the backoff, as UNAVAILABLE. The same codes from the server
//    are dgmm's own verdict on the job (a CUDA error, a job that can never
//    fit): final.
//  - Anything else (CANCELLED, DEADLINE_EXCEEDED, INVALID_ARGUMENT, ...):
//    final.
// Also nullopt when no attempts are left (attempts_made >= max_attempts) or
// the wait would not end before `deadline`.
std::optional<absl::Duration> RetryDelay(const RetryPolicy& policy, int attempts_made,
                                         absl::StatusCode code, FailureOrigin origin,
                                         std::optional<absl::Duration> pushback, absl::Time now,
                                         absl::Time deadline, double jitter);

// A random jitter for RetryDelay, uniform in [-1, 1].
double RandomJitter();

// Attaches `pushback` to a final `status` (read back by RetryAfterMsOf).
void SetRetryAfter(absl::Status* status, absl::Duration pushback);

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_SRC_RETRY_H_
