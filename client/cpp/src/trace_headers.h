// The W3C trace context a job's calls carry (docs/protocol.md, "Trace
// context"): the caller's traceparent and tracestate, checked, or a new
// traceparent for a job that came without one; added to each call's
// metadata.
#ifndef DGMM_CLIENT_CPP_SRC_TRACE_HEADERS_H_
#define DGMM_CLIENT_CPP_SRC_TRACE_HEADERS_H_

#include <grpcpp/client_context.h>

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/trace_context.h"

namespace dgmm::internal {

// Fills an empty *traceparent with a new one (a random trace id and span id,
// flags 00); INVALID_ARGUMENT for a traceparent the server would ignore
// (not version 00's form or a later version's, uppercase hex, all-zero
// ids, version ff), a tracestate without a traceparent, or a tracestate
// with characters outside printable ASCII (metadata cannot carry them).
// `what` names the caller's fields in the message ("Job", "traceparent").
inline absl::Status ResolveTrace(std::string* traceparent, const std::string& tracestate,
                                 const char* what) {
  if (traceparent->empty()) {
    if (!tracestate.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a tracestate needs a traceparent (W3C trace context)"));
    }
    *traceparent = NewTraceContext().Traceparent();
    return absl::OkStatus();
  }
  if (!ParseTraceparent(*traceparent).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": traceparent '", *traceparent,
        "' is not a W3C traceparent (00-<32 lowercase hex>-<16 lowercase hex>-<2 hex>, ids not "
        "all zero)"));
  }
  if (!std::all_of(tracestate.begin(), tracestate.end(),
                   [](char c) { return c >= 0x20 && c < 0x7f; })) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": tracestate holds characters other than printable ASCII"));
  }
  return absl::OkStatus();
}

inline void AddTraceMetadata(grpc::ClientContext* context, const std::string& traceparent,
                             const std::string& tracestate) {
  if (traceparent.empty()) return;
  context->AddMetadata(kTraceparentKey, traceparent);
  if (!tracestate.empty()) context->AddMetadata(kTracestateKey, tracestate);
}

}  // namespace dgmm::internal

#endif  // DGMM_CLIENT_CPP_SRC_TRACE_HEADERS_H_
