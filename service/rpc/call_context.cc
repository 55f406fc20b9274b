#include "service/rpc/call_context.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/trace_context.h"
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

absl::string_view View(grpc::string_ref s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

std::optional<TraceContext> CallTraceContext(const CallMetadata& metadata,
                                             std::string* tracestate) {
  tracestate->clear();
  // One traceparent (two or more are invalid, as a malformed one is) ...
  if (metadata.count(kTraceparentKey) == 1) {
    std::optional<TraceContext> parent =
        ParseTraceparent(View(metadata.find(kTraceparentKey)->second));
    if (parent.has_value()) {
      // ... with its tracestate, several headers of it joined by commas,
      // kept only as a whole of at most kMaxTracestateBytes.
      auto [first, last] = metadata.equal_range(kTracestateKey);
      for (auto it = first; it != last; ++it) {
        if (!tracestate->empty()) tracestate->push_back(',');
        tracestate->append(it->second.data(), it->second.size());
      }
      if (!UsableTracestate(*tracestate)) tracestate->clear();
      return parent;
    }
  }
  // ... else gRPC's binary header.
  if (auto bin = metadata.find(kGrpcTraceBinKey); bin != metadata.end()) {
    return ParseGrpcTraceBin(View(bin->second));
  }
  return std::nullopt;
}

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
  std::string tracestate;
  if (std::optional<TraceContext> parent = CallTraceContext(metadata, &tracestate);
      parent.has_value()) {
    // The server's span for this call, in the trailers whatever the outcome.
    info_.trace = JobTrace{*parent, NewSpanId()};
    TraceContext own = *parent;
    own.span_id = info_.trace->span_id;
    context->AddTrailingMetadata(kTraceparentKey, own.Traceparent());
    if (!tracestate.empty()) context->AddTrailingMetadata(kTracestateKey, tracestate);
  }
}

grpc::Status CallContext::Status(const absl::Status& s) const { return ToGrpcStatus(s, context_); }

}  // namespace dgmm
