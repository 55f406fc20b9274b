// W3C Trace Context (https://www.w3.org/TR/trace-context/) for both ends of
// the wire: the `traceparent` value parsed and written, `tracestate`'s
// limit, and gRPC's binary `grpc-trace-bin` (the OpenCensus binary format).
// Plain values, Abseil only: the server's engine keeps a job's trace in its
// stats (service/core/job_stats.h) and the C++ client sends one on every
// call of a job (docs/protocol.md, "Trace context"). Part of dgmm_proto.
#ifndef DGMM_PROTO_TRACE_CONTEXT_H_
#define DGMM_PROTO_TRACE_CONTEXT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace dgmm {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

// Lowercase hex of an id: 32 or 16 digits.
std::string ToHex(const TraceId& id);
std::string ToHex(const SpanId& id);

// The ids of one position in a trace: the trace, a span of it (in a
// received `traceparent`, the sender's span: the receiver's parent), and the
// trace flags (bit 0: sampled).
struct TraceContext {
  TraceId trace_id{};
  SpanId span_id{};
  uint8_t flags = 0;

  // Both ids non-zero (all-zero ids are invalid in the spec).
  bool valid() const;
  std::string trace_id_hex() const;  // 32 lowercase hex digits
  std::string span_id_hex() const;   // 16 lowercase hex digits
  std::string flags_hex() const;     // 2 lowercase hex digits
  // "00-<trace id>-<span id>-<flags>", version 00 whatever version came in.
  std::string Traceparent() const;
};

inline constexpr char kTraceparentKey[] = "traceparent";
inline constexpr char kTracestateKey[] = "tracestate";
inline constexpr char kGrpcTraceBinKey[] = "grpc-trace-bin";
// The longest `tracestate` passed on; a longer one is dropped whole.
inline constexpr size_t kMaxTracestateBytes = 512;

// A `traceparent` value, or nullopt when it is not one the spec lets a
// receiver use: not "VV-<32 hex>-<16 hex>-<2 hex>" in lowercase hex, version
// ff, an all-zero trace id or span id, a version 00 value with anything
// after the flags, or a later version whose flags are followed by anything
// but "-" (a later version is read as version 00's fields, as the spec asks).
std::optional<TraceContext> ParseTraceparent(absl::string_view value);

// A `grpc-trace-bin` value (the bytes, not base64): version 0, then field 0
// (the trace id, 16 bytes), field 1 (the span id, 8 bytes) and, optionally,
// field 2 (the trace options, 1 byte), in that order; parsing stops at an
// unknown field. nullopt when a version is not 0, an id is missing, short
// or all zero.
std::optional<TraceContext> ParseGrpcTraceBin(absl::string_view bytes);
// The 29 bytes of `grpc-trace-bin` for `context`.
std::string GrpcTraceBin(const TraceContext& context);

// Whether `value` may go on as a `tracestate`: at most kMaxTracestateBytes,
// and only printable ASCII (no control characters that could break a log
// line or a header).
bool UsableTracestate(absl::string_view value);

// A span id of 8 random bytes, never all zero.
SpanId NewSpanId();
// A new trace: a random trace id and span id, flags 00 (not sampled).
TraceContext NewTraceContext();

}  // namespace dgmm

#endif  // DGMM_PROTO_TRACE_CONTEXT_H_
