// What every dgmm RPC does first, written once (as Arrow Flight's server
// middleware does it): check the bearer token, name the client for the fair
// share, read the deadline and the trace context (answered in the trailers
// with the server's own span), and count the call while gRPC holds it (Drain
// waits for the count to reach zero). Each reactor holds one CallContext for
// its whole life.
#ifndef DGMM_SERVICE_RPC_CALL_CONTEXT_H_
#define DGMM_SERVICE_RPC_CALL_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "proto/trace_context.h"
#include "service/job/session.h"
#include "service/rpc/auth.h"

namespace dgmm {

// What a service's calls share: its token check and its count of calls.
struct CallPolicy {
  std::optional<TokenAuth> auth;
  // Peer addresses (as in "10.0.0.5", "::1") of proxies whose
  // `x-forwarded-for` metadata names the client (--trusted_proxies).
  std::vector<std::string> trusted_proxies;
  std::atomic<int64_t> calls{0};
};

// Who a call comes from, for the fair share of the queue
// (docs/admission.md): the peer's address without its port ("127.0.0.1",
// "::1"), with the name of its bearer token when several are configured
// (`token_index` > 0), is the client (the share's ceiling); the peer with its
// port is its connection, the unit that takes turns. From a trusted proxy,
// the first address of `x-forwarded-for` (`forwarded_for`) is both. `peer`
// is gRPC's: "ipv4:1.2.3.4:5", "ipv6:[::1]:5", "unix:...". Fills client,
// connection and token of `info`.
// The W3C trace context of a call's metadata (docs/protocol.md, "Trace
// context"): one valid `traceparent`, with `tracestate` (its headers joined
// by commas; left empty when over kMaxTracestateBytes or not printable),
// else a valid `grpc-trace-bin`, else nullopt (a malformed or repeated
// traceparent counts as none).
using CallMetadata = std::multimap<grpc::string_ref, grpc::string_ref>;
std::optional<TraceContext> CallTraceContext(const CallMetadata& metadata,
                                             std::string* tracestate);

void ClientKeys(absl::string_view peer, int token_index,
                const std::vector<std::string>& trusted_proxies,
                std::optional<absl::string_view> forwarded_for, CallInfo* info);

class CallContext {
 public:
  CallContext(grpc::CallbackServerContext* context, CallPolicy* policy);
  ~CallContext() { policy_->calls.fetch_sub(1); }
  CallContext(const CallContext&) = delete;
  CallContext& operator=(const CallContext&) = delete;

  // OK, or UNAUTHENTICATED when the call lacks a configured token.
  const absl::Status& auth() const { return auth_; }
  // The client key (a token index and the peer's address), when and by
  // when: for the job's session.
  const CallInfo& info() const { return info_; }
  grpc::CallbackServerContext* grpc() const { return context_; }
  // `s` as a gRPC status, its retry pushback put in the trailers.
  grpc::Status Status(const absl::Status& s) const;

 private:
  grpc::CallbackServerContext* const context_;
  CallPolicy* const policy_;
  absl::Status auth_;
  CallInfo info_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_CALL_CONTEXT_H_
