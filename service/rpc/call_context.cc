#include "service/rpc/call_context.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "service/rpc/status_map.h"

namespace dgmm {
namespace {

absl::Time DeadlineOf(const grpc::CallbackServerContext* context) {
  const auto d = context->deadline();
  if (d >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

// Who a call comes from, for the fair share of the queue: the peer's address
// without its port ("127.0.0.1", "::1"), so that one client's connections
// count as one, with the index of its bearer token when several are
// configured.
std::string ClientKey(const grpc::CallbackServerContext* context, int token_index) {
  std::string peer = context->peer();  // "ipv4:1.2.3.4:5", "ipv6:[::1]:5", "unix:..."
  absl::string_view host(peer);
  if (const size_t colon = host.find(':'); colon != absl::string_view::npos) {
    const absl::string_view scheme = host.substr(0, colon);
    if (scheme == "ipv4" || scheme == "ipv6") {
      host.remove_prefix(colon + 1);
      if (!host.empty() && host.front() == '[') {
        host = host.substr(1, host.find(']') - 1);
      } else if (const size_t port = host.rfind(':'); port != absl::string_view::npos) {
        host = host.substr(0, port);
      }
    }
  }
  return token_index > 0 ? absl::StrCat("token", token_index, "@", host) : std::string(host);
}

}  // namespace

CallContext::CallContext(grpc::CallbackServerContext* context, CallPolicy* policy)
    : context_(context), policy_(policy) {
  policy_->calls.fetch_add(1);
  int token = 0;
  if (policy_->auth.has_value()) {
    absl::StatusOr<int> matched = policy_->auth->Match(context->client_metadata());
    if (matched.ok()) {
      token = *matched;
    } else {
      auth_ = matched.status();
    }
  }
  info_ = CallInfo{.client = ClientKey(context, token),
                   .arrived = absl::Now(),
                   .deadline = DeadlineOf(context)};
}

grpc::Status CallContext::Status(const absl::Status& s) const { return ToGrpcStatus(s, context_); }

}  // namespace dgmm
