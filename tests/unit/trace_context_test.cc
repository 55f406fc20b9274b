// W3C trace context: traceparent and grpc-trace-bin as the spec's valid and
// invalid cases (proto/trace_context.h), the call metadata the server reads
// (CallTraceContext, service/rpc/call_context.h), the JSON escaping of the
// log (service/core/log.h) and the job lines (service/engine/job_log.h).
#include "proto/trace_context.h"

#include <map>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "service/core/log.h"
#include "service/core/outcome.h"
#include "service/engine/job_log.h"
#include "service/rpc/call_context.h"

namespace dgmm {
namespace {

// The spec's example.
constexpr char kTrace[] = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr char kParent[] = "00f067aa0ba902b7";
const std::string kValid = std::string("00-") + kTrace + "-" + kParent + "-01";

TEST(TraceparentTest, TheSpecsExampleParses) {
  std::optional<TraceContext> t = ParseTraceparent(kValid);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->trace_id_hex(), kTrace);
  EXPECT_EQ(t->span_id_hex(), kParent);
  EXPECT_EQ(t->flags, 1);
  EXPECT_EQ(t->Traceparent(), kValid);
  std::optional<TraceContext> unsampled =
      ParseTraceparent(std::string("00-") + kTrace + "-" + kParent + "-00");
  ASSERT_TRUE(unsampled.has_value());
  EXPECT_EQ(unsampled->flags, 0);
}

TEST(TraceparentTest, MalformedValuesAreRefused) {
  const std::string t = kTrace;
  const std::string p = kParent;
  for (const std::string& bad : {
           std::string(),
           std::string("00"),
           "00-" + t + "-" + p,                                  // no flags
           "00-" + t + "-" + p + "-1",                           // one flag digit
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-" + p + "-01",   // uppercase trace id
           "00-" + t + "-00F067AA0BA902B7-01",                   // uppercase parent id
           "00-" + t + "-" + p + "-0A",                          // uppercase flags
           "0A-" + t + "-" + p + "-01",                          // uppercase version
           "00-00000000000000000000000000000000-" + p + "-01",   // all-zero trace id
           "00-" + t + "-0000000000000000-01",                   // all-zero parent id
           "ff-" + t + "-" + p + "-01",                          // version ff
           "00-" + t + "-" + p + "-01-extra",                    // version 00 with more
           "00-" + t + "-" + p + "-01 ",                         // trailing space
           " 00-" + t + "-" + p + "-01",                         // leading space
           "00_" + t + "_" + p + "_01",                          // not dashes
           "00-" + t.substr(1) + "-" + p + "-01",                // a short trace id
           "00-" + t + "-" + p.substr(1) + "-01",                // a short parent id
           "00-" + t + "0-" + p + "-01",                         // a long trace id
           "00-" + t.substr(0, 31) + "g-" + p + "-01",           // not hex
           "00-" + t + "-" + p + "-zz",                          // flags not hex
           "cc-" + t + "-" + p + "-01x",                         // a later version, no dash
       }) {
    EXPECT_FALSE(ParseTraceparent(bad).has_value()) << bad;
  }
}

TEST(TraceparentTest, ALaterVersionIsReadAsVersion00) {
  // The spec: a receiver of a higher version reads the first 55 characters
  // as version 00's fields when what follows starts with a dash.
  const std::string later = std::string("cc-") + kTrace + "-" + kParent + "-01";
  std::optional<TraceContext> t = ParseTraceparent(later + "-what-the-future-will-be-like");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->trace_id_hex(), kTrace);
  EXPECT_EQ(t->Traceparent(), kValid);  // answered as version 00
  EXPECT_TRUE(ParseTraceparent(later).has_value());
}

TEST(GrpcTraceBinTest, TheBinaryFormatRoundTrips) {
  const TraceContext t = *ParseTraceparent(kValid);
  const std::string bin = GrpcTraceBin(t);
  ASSERT_EQ(bin.size(), 29u);
  EXPECT_EQ(bin[0], 0);   // version
  EXPECT_EQ(bin[1], 0);   // field 0: trace id
  EXPECT_EQ(bin[18], 1);  // field 1: span id
  EXPECT_EQ(bin[27], 2);  // field 2: options
  std::optional<TraceContext> back = ParseGrpcTraceBin(bin);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->Traceparent(), kValid);
  // The options field is optional; anything after the known fields is ignored.
  std::optional<TraceContext> no_options = ParseGrpcTraceBin(bin.substr(0, 27));
  ASSERT_TRUE(no_options.has_value());
  EXPECT_EQ(no_options->flags, 0);
  EXPECT_TRUE(ParseGrpcTraceBin(bin + std::string("\x07xyz", 4)).has_value());
}

TEST(GrpcTraceBinTest, MalformedValuesAreRefused) {
  const std::string bin = GrpcTraceBin(*ParseTraceparent(kValid));
  std::string v1 = bin;
  v1[0] = 1;
  std::string swapped = bin;
  swapped[1] = 1;
  std::string zero_trace = bin;
  std::fill(zero_trace.begin() + 2, zero_trace.begin() + 18, '\0');
  std::string zero_span = bin;
  std::fill(zero_span.begin() + 19, zero_span.begin() + 27, '\0');
  for (const std::string& bad :
       {std::string(), v1, swapped, zero_trace, zero_span, bin.substr(0, 17), bin.substr(0, 26)}) {
    EXPECT_FALSE(ParseGrpcTraceBin(bad).has_value()) << bad.size();
  }
}

TEST(TracestateTest, UpTo512PrintableCharactersGoOn) {
  EXPECT_TRUE(UsableTracestate("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"));
  EXPECT_TRUE(UsableTracestate(std::string(512, 'a')));
  EXPECT_FALSE(UsableTracestate(std::string(513, 'a')));
  EXPECT_FALSE(UsableTracestate(""));
  EXPECT_FALSE(UsableTracestate("a=b\nc=d"));
}

TEST(NewTraceContextTest, NewIdsAreValidAndDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const TraceContext t = NewTraceContext();
    ASSERT_TRUE(t.valid());
    EXPECT_EQ(t.flags, 0);
    std::optional<TraceContext> back = ParseTraceparent(t.Traceparent());
    ASSERT_TRUE(back.has_value()) << t.Traceparent();
    EXPECT_TRUE(seen.insert(t.trace_id_hex()).second);
    EXPECT_EQ(ToHex(NewSpanId()).size(), 16u);
  }
}

CallMetadata Metadata(const std::multimap<std::string, std::string>& m) {
  CallMetadata out;
  for (const auto& [k, v] : m) out.emplace(grpc::string_ref(k), grpc::string_ref(v));
  return out;
}

TEST(CallTraceContextTest, OneTraceparentWithItsTracestates) {
  const std::multimap<std::string, std::string> m = {
      {"traceparent", kValid}, {"tracestate", "a=1"}, {"tracestate", "b=2"}};
  std::string state;
  std::optional<TraceContext> t = CallTraceContext(Metadata(m), &state);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->trace_id_hex(), kTrace);
  EXPECT_EQ(state, "a=1,b=2");
}

TEST(CallTraceContextTest, ALongTracestateIsDroppedTheTraceparentKept) {
  const std::multimap<std::string, std::string> m = {{"traceparent", kValid},
                                                     {"tracestate", std::string(513, 'x')}};
  std::string state = "stale";
  EXPECT_TRUE(CallTraceContext(Metadata(m), &state).has_value());
  EXPECT_EQ(state, "");
}

TEST(CallTraceContextTest, GrpcTraceBinWhenNoValidTraceparent) {
  TraceContext other = NewTraceContext();
  const std::string bin = GrpcTraceBin(other);
  std::string state;
  // Only the binary header.
  std::optional<TraceContext> t =
      CallTraceContext(Metadata({{"grpc-trace-bin", bin}, {"tracestate", "a=1"}}), &state);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->trace_id_hex(), other.trace_id_hex());
  EXPECT_EQ(state, "");  // a tracestate goes with a traceparent only
  // A malformed traceparent, and a repeated one, count as none.
  t = CallTraceContext(Metadata({{"traceparent", "00-xyz"}, {"grpc-trace-bin", bin}}), &state);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->trace_id_hex(), other.trace_id_hex());
  t = CallTraceContext(
      Metadata({{"traceparent", kValid}, {"traceparent", kValid}, {"grpc-trace-bin", bin}}),
      &state);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->trace_id_hex(), other.trace_id_hex());
  // A valid traceparent wins over the binary header.
  t = CallTraceContext(Metadata({{"traceparent", kValid}, {"grpc-trace-bin", bin}}), &state);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->trace_id_hex(), kTrace);
  // Nothing usable.
  EXPECT_FALSE(CallTraceContext(Metadata({{"traceparent", "00-xyz"}}), &state).has_value());
  EXPECT_FALSE(CallTraceContext(Metadata({{"grpc-trace-bin", "x"}}), &state).has_value());
  EXPECT_FALSE(CallTraceContext(Metadata({}), &state).has_value());
}

TEST(JsonStringTest, EscapesWhatJsonNeedsAndKeepsValidUtf8) {
  EXPECT_EQ(JsonString("plain"), "\"plain\"");
  EXPECT_EQ(JsonString("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonString("l1\nl2\r\t"), "\"l1\\nl2\\r\\t\"");
  EXPECT_EQ(JsonString(std::string("\x01\x1f\x7f", 3)), "\"\\u0001\\u001f\\u007f\"");
  EXPECT_EQ(JsonString(std::string("\0", 1)), "\"\\u0000\"");
  EXPECT_EQ(JsonString("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  // Not UTF-8: a lone continuation byte, a cut sequence, an overlong form, a
  // surrogate, 0xff.
  EXPECT_EQ(JsonString("\x80"), "\"\\ufffd\"");
  EXPECT_EQ(JsonString("\xc3"), "\"\\ufffd\"");
  EXPECT_EQ(JsonString("\xe2\x82"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonString("\xc0\xaf"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonString("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonString("a\xff" "b"), "\"a\\ufffdb\"");
}

TEST(JobLogTest, TextLinesNameTheCallAndTheTrace) {
  JobCall call{"MultiplyStream", "127.0.0.1", JobTrace{*ParseTraceparent(kValid), {}}};
  call.trace->span_id.fill(0x11);
  JobStats stats;
  stats.job_id = 7;
  const std::optional<JobGroup> group = JobGroup{"g1", 10, 40, 4};
  EXPECT_EQ(JobLogText({.call = &call, .group = &group, .lines = 10, .stats = &stats,
                        .status = absl::OkStatus()}),
            std::string("job 7 group g1 lines [10,20) of 40 (4 parts): completed; "
                        "method=MultiplyStream client=127.0.0.1 trace=") +
                kTrace + " parent=" + kParent + " span=1111111111111111");
  const JobCall untraced{"Multiply", "::1", std::nullopt};
  EXPECT_EQ(JobLogText({.call = &untraced,
                        .status = WithOutcome(absl::ResourceExhaustedError("queue is full"),
                                              Outcome::kQueueFull)}),
            "job 0: queue_full (RESOURCE_EXHAUSTED: queue is full); method=Multiply client=::1 "
            "trace=- parent=- span=-");
}

TEST(JobLogTest, JsonLinesHaveEveryField) {
  const JobCall call{"ModelInfer", "token2@127.0.0.1",
                     JobTrace{*ParseTraceparent(kValid), NewSpanId()}};
  JobStats stats;
  stats.job_id = 9;
  stats.device = "cpu \"2\" threads";
  stats.backend = BackendKind::kCpu;
  stats.bytes_in = 100;
  stats.compute_ns = 5;
  const std::string line = JobLogJson({.call = &call,
                                       .stats = &stats,
                                       .status = absl::InternalError("bad\nthing")});
  for (const std::string& part :
       {std::string("{\"time\":\""), std::string("\"level\":\"error\""),
        std::string("\"msg\":\"job\""), std::string("\"job_id\":9"),
        std::string("\"method\":\"ModelInfer\""), std::string("\"client\":\"token2@127.0.0.1\""),
        std::string("\"trace_id\":\"") + kTrace + "\"",
        std::string("\"parent_span_id\":\"") + kParent + "\"", std::string("\"span_id\":\""),
        std::string("\"trace_flags\":\"01\""), std::string("\"status\":\"INTERNAL\""),
        std::string("\"outcome\":\"internal\""), std::string("\"error\":\"bad\\nthing\""),
        std::string("\"device\":\"cpu \\\"2\\\" threads\""), std::string("\"backend\":\"cpu\""),
        std::string("\"bytes_in\":100"), std::string("\"compute_ns\":5")}) {
    EXPECT_NE(line.find(part), std::string::npos) << part << " in " << line;
  }
  EXPECT_EQ(line.back(), '}');
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const std::string untraced = JobLogJson({.status = absl::OkStatus()});
  EXPECT_NE(untraced.find("\"trace_id\":null"), std::string::npos) << untraced;
}

}  // namespace
}  // namespace dgmm
