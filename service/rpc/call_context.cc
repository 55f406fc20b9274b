#include "service/rpc/call_context.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/ascii.h"
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

}  // namespace

void ClientKeys(absl::string_view peer, int token_index,
                const std::vector<std::string>& trusted_proxies,
                std::optional<absl::string_view> forwarded_for, CallInfo* info) {
  absl::string_view host(peer);
  absl::string_view connection(peer);
  if (const size_t colon = host.find(':'); colon != absl::string_view::npos) {
    const absl::string_view scheme = host.substr(0, colon);
    if (scheme == "ipv4" || scheme == "ipv6") {
      host.remove_prefix(colon + 1);
      connection = host;
      if (!host.empty() && host.front() == '[') {
        host = host.substr(1, host.find(']') - 1);
      } else if (const size_t port = host.rfind(':'); port != absl::string_view::npos) {
        host = host.substr(0, port);
      }
    }
  }
  if (forwarded_for.has_value() &&
      std::find(trusted_proxies.begin(), trusted_proxies.end(), host) != trusted_proxies.end()) {
    absl::string_view forwarded = *forwarded_for;
    forwarded = absl::StripAsciiWhitespace(forwarded.substr(0, forwarded.find(',')));
    if (!forwarded.empty() && forwarded.size() <= 64) {
      host = forwarded;
      connection = forwarded;
    }
  }
  info->token = token_index > 0 ? absl::StrCat("token", token_index) : "";
  const std::string prefix = token_index > 0 ? absl::StrCat(info->token, "@") : "";
  info->client = absl::StrCat(prefix, host);
  info->connection = absl::StrCat(prefix, connection);
}

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
  info_.arrived = absl::Now();
  info_.deadline = DeadlineOf(context);
  std::optional<absl::string_view> forwarded;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find("x-forwarded-for"); it != metadata.end()) {
    forwarded = absl::string_view(it->second.data(), it->second.size());
  }
  ClientKeys(context->peer(), token, policy_->trusted_proxies, forwarded, &info_);
}

grpc::Status CallContext::Status(const absl::Status& s) const { return ToGrpcStatus(s, context_); }

}  // namespace dgmm
