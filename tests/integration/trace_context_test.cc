// W3C trace context through the real server on loopback (docs/protocol.md,
// "Trace context"): a call's traceparent (or grpc-trace-bin) reaches the
// job's stats, its log line and the traceparent trailer, on success and on
// failure; malformed ones are ignored; dgmm::Client sends the caller's, or
// one it makes, on every call of a job -- each part of a striped job, a
// batch, a MultiplyStream, a same-host region job -- and the OIP ModelInfer
// answers it too.
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dgmm/client.h"
#include "dgmm/v1/dgmm.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "proto/trace_context.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/operands.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using testing::Connect;
using testing::MakeJob;
using testing::Operands;
using testing::RandomJob;
using testing::ServerProcess;
using testing::WaitUntil;

constexpr char kTrace[] = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr char kParent[] = "00f067aa0ba902b7";
const std::string kTraceparent = std::string("00-") + kTrace + "-" + kParent + "-01";
constexpr char kTracestate[] = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

ServerProcess& SharedServer() {
  static ServerProcess server({"--backend=cpu", "--threads=2"});
  return server;
}

bool IsHex(const std::string& s, size_t n) {
  return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// The value of trailer `key`, or "" when the call had none.
std::string Trailer(const grpc::ClientContext& context, const std::string& key) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(key);
  return it == trailers.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// Waits until the server's log has a line containing `text`.
bool LogHas(ServerProcess& server, const std::string& text) {
  return WaitUntil([&] { return server.Log().find(text) != std::string::npos; }, 5000);
}

// The job line's tail for a traced call.
std::string TraceTail(const std::string& method, const std::string& trace,
                      const std::string& parent, const std::string& span) {
  return absl::StrCat("; method=", method, " client=127.0.0.1 trace=", trace, " parent=", parent,
                      " span=", span);
}

void ExpectTraced(const v1::JobStats& stats, const grpc::ClientContext& context,
                  const std::string& trace, const std::string& parent, const std::string& flags) {
  EXPECT_EQ(stats.trace_id(), trace);
  EXPECT_EQ(stats.parent_span_id(), parent);
  EXPECT_TRUE(IsHex(stats.span_id(), 16)) << stats.span_id();
  EXPECT_NE(stats.span_id(), parent);
  EXPECT_NE(stats.span_id(), std::string(16, '0'));
  // The trailer continues the caller's trace with the server's span.
  EXPECT_EQ(Trailer(context, "traceparent"),
            absl::StrCat("00-", trace, "-", stats.span_id(), "-", flags));
}

TEST(TraceContextTest, AGivenTraceparentReachesStatsTrailerAndLog) {
  ServerProcess& server = SharedServer();
  auto stub = Connect(server.address());
  const RandomJob job = MakeJob(3, 4, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1);
  for (const bool small : {true, false}) {
    grpc::ClientContext context;
    context.AddMetadata("traceparent", kTraceparent);
    context.AddMetadata("tracestate", kTracestate);
    v1::MultiplyResponse response;
    const grpc::Status s = small ? testing::SmallJob(stub.get(), job, &response, &context)
                                 : testing::UnaryJob(stub.get(), job, &response, &context);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ExpectTraced(response.stats(), context, kTrace, kParent, "01");
    EXPECT_EQ(Trailer(context, "tracestate"), kTracestate);
    EXPECT_TRUE(LogHas(server, absl::StrCat("job ", response.stats().job_id(), ": completed",
                                            TraceTail(small ? "MultiplySmall" : "Multiply", kTrace,
                                                      kParent, response.stats().span_id()))))
        << server.Log();
  }
  // MultiplyStream: the stats come with the last message.
  grpc::ClientContext context;
  context.AddMetadata("traceparent", kTraceparent);
  const RandomJob big = MakeJob(64, 64, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 2);
  std::string result;
  v1::JobStats stats;
  const grpc::Status s = testing::StreamJob(stub.get(), big, 16, &result, &stats, &context);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectTraced(stats, context, kTrace, kParent, "01");
  EXPECT_EQ(Trailer(context, "tracestate"), "");
  EXPECT_TRUE(LogHas(server, absl::StrCat("job ", stats.job_id(), ": completed",
                                          TraceTail("MultiplyStream", kTrace, kParent,
                                                    stats.span_id()))))
      << server.Log();
}

TEST(TraceContextTest, AFailedJobStillAnswersTheTrailer) {
  ServerProcess& server = SharedServer();
  auto stub = Connect(server.address());
  // A valid header that can never fit (too_large, refused by the intake).
  RandomJob huge;
  huge.header.set_rows(int64_t{1} << 20);
  huge.header.set_cols(int64_t{1} << 20);
  huge.header.set_dtype(v1::DTYPE_FLOAT64);
  huge.header.set_side(v1::SIDE_LEFT);
  huge.header.set_diagonal(std::string((size_t{1} << 20) * 8, '\0'));
  const std::string parent = "1234567890abcdef";
  const std::string traceparent = absl::StrCat("00-", kTrace, "-", parent, "-00");
  grpc::ClientContext context;
  context.AddMetadata("traceparent", traceparent);
  v1::MultiplyResponse response;
  grpc::Status s = testing::UnaryJob(stub.get(), huge, &response, &context);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  const std::string trailer = Trailer(context, "traceparent");
  ASSERT_TRUE(ParseTraceparent(trailer).has_value()) << trailer;
  EXPECT_EQ(trailer.substr(0, 36), absl::StrCat("00-", kTrace, "-"));
  EXPECT_EQ(trailer.substr(52), "-00");
  const std::string span = trailer.substr(36, 16);
  EXPECT_NE(span, parent);
  // Refused before admission: job 0, with the call's trace.
  EXPECT_TRUE(LogHas(server, absl::StrCat("job 0: too_large (RESOURCE_EXHAUSTED")));
  EXPECT_TRUE(LogHas(server, TraceTail("Multiply", kTrace, parent, span))) << server.Log();

  // A header the validator refuses: no job line, but the trailer.
  RandomJob bad = MakeJob(2, 2, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 3);
  bad.header.set_rows(0);
  grpc::ClientContext bad_context;
  bad_context.AddMetadata("traceparent", traceparent);
  s = testing::SmallJob(stub.get(), bad, &response, &bad_context);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Trailer(bad_context, "traceparent").substr(0, 36), absl::StrCat("00-", kTrace, "-"));
}

TEST(TraceContextTest, MalformedTraceparentsAreIgnored) {
  ServerProcess& server = SharedServer();
  auto stub = Connect(server.address());
  const RandomJob job = MakeJob(2, 3, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 4);
  const std::string t = kTrace;
  const std::string p = kParent;
  const std::vector<std::vector<std::string>> cases = {
      {"00-4BF92F3577B34DA6A3CE929D0E0E4736-" + p + "-01"},  // uppercase
      {"00-00000000000000000000000000000000-" + p + "-01"},  // zero trace id
      {"00-" + t + "-0000000000000000-01"},                  // zero parent id
      {"ff-" + t + "-" + p + "-01"},                         // version ff
      {"00-" + t + "-" + p + "-01-00"},                      // version 00 with more
      {"00-" + t + "-" + p},                                 // no flags
      {"garbage"},
      {kTraceparent, kTraceparent},                          // two of them
  };
  for (const std::vector<std::string>& values : cases) {
    grpc::ClientContext context;
    for (const std::string& v : values) context.AddMetadata("traceparent", v);
    context.AddMetadata("tracestate", kTracestate);
    v1::MultiplyResponse response;
    const grpc::Status s = testing::SmallJob(stub.get(), job, &response, &context);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.stats().trace_id(), "") << values[0];
    EXPECT_EQ(response.stats().parent_span_id(), "") << values[0];
    EXPECT_EQ(response.stats().span_id(), "") << values[0];
    EXPECT_EQ(Trailer(context, "traceparent"), "") << values[0];
    EXPECT_EQ(Trailer(context, "tracestate"), "") << values[0];
    EXPECT_TRUE(LogHas(server, absl::StrCat("job ", response.stats().job_id(),
                                            ": completed; method=MultiplySmall client=127.0.0.1 "
                                            "trace=- parent=- span=-")))
        << server.Log();
  }
  // No trace context at all: none invented.
  v1::MultiplyResponse response;
  ASSERT_TRUE(testing::SmallJob(stub.get(), job, &response).ok());
  EXPECT_EQ(response.stats().trace_id(), "");
}

TEST(TraceContextTest, GrpcTraceBinIsAcceptedWithoutATraceparent) {
  ServerProcess& server = SharedServer();
  auto stub = Connect(server.address());
  const RandomJob job = MakeJob(2, 3, v1::DTYPE_FLOAT64, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT, 5);
  TraceContext sent = NewTraceContext();
  sent.flags = 1;
  // A valid traceparent wins over it.
  {
    grpc::ClientContext context;
    context.AddMetadata("grpc-trace-bin", GrpcTraceBin(sent));
    context.AddMetadata("traceparent", kTraceparent);
    v1::MultiplyResponse response;
    ASSERT_TRUE(testing::SmallJob(stub.get(), job, &response, &context).ok());
    EXPECT_EQ(response.stats().trace_id(), kTrace);
  }
  bool seen = false;
  for (const bool with_bad_traceparent : {false, true}) {
    grpc::ClientContext context;
    context.AddMetadata("grpc-trace-bin", GrpcTraceBin(sent));
    if (with_bad_traceparent) context.AddMetadata("traceparent", "00-nope");
    v1::MultiplyResponse response;
    const grpc::Status s = testing::SmallJob(stub.get(), job, &response, &context);
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (response.stats().trace_id().empty()) {
      // gRPC core keeps grpc-trace-bin for its census filter: 1.51 (Debian
      // 12's) never hands it to the application, so the server cannot see
      // it (docs/protocol.md section 12). The job runs untraced.
      EXPECT_EQ(Trailer(context, "traceparent"), "");
      continue;
    }
    seen = true;
    ExpectTraced(response.stats(), context, sent.trace_id_hex(), sent.span_id_hex(), "01");
    EXPECT_TRUE(LogHas(server, TraceTail("MultiplySmall", sent.trace_id_hex(),
                                         sent.span_id_hex(), response.stats().span_id())))
        << server.Log();
  }
  if (!seen) {
    GTEST_SKIP() << "gRPC " << grpc::Version()
                 << " does not pass grpc-trace-bin to the application; the server's reading "
                    "of it is covered by CallTraceContextTest (unit)";
  }
}

TEST(TraceContextTest, EveryPartOfAStripedJobCarriesTheCallersTraceId) {
  ServerProcess& server = SharedServer();
  ClientOptions options;
  options.stripes = 4;
  Client client(server.address(), options);
  for (const bool given : {true, false}) {
    Operands<float> ops(64, 32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, given ? 6 : 7);
    Job job = ops.MakeJob();
    if (given) {
      job.traceparent = kTraceparent;
      job.tracestate = kTracestate;
    }
    std::vector<float> c = ops.NanOutput();
    absl::StatusOr<JobResult> r = client.Multiply(job, c.data(), c.size() * sizeof(float));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->part_stats.size(), 4u);
    std::optional<TraceContext> sent = ParseTraceparent(r->traceparent);
    ASSERT_TRUE(sent.has_value()) << r->traceparent;
    if (given) {
      EXPECT_EQ(r->traceparent, kTraceparent);
    } else {
      EXPECT_EQ(sent->flags, 0);  // made by the client: not sampled
    }
    std::set<std::string> spans;
    for (const v1::JobStats& part : r->part_stats) {
      EXPECT_EQ(part.trace_id(), sent->trace_id_hex());
      EXPECT_EQ(part.parent_span_id(), sent->span_id_hex());
      spans.insert(part.span_id());
      EXPECT_TRUE(LogHas(server, absl::StrCat("job ", part.job_id(), " group ", part.group().id(),
                                              " lines [")))
          << server.Log();
      EXPECT_TRUE(LogHas(server, absl::StrCat("(4 parts): completed",
                                              TraceTail("MultiplySmall", sent->trace_id_hex(),
                                                        sent->span_id_hex(), part.span_id()))))
          << server.Log();
    }
    EXPECT_EQ(spans.size(), 4u);  // each call its own span on the server
    EXPECT_EQ(r->stats.trace_id(), sent->trace_id_hex());
  }
}

TEST(TraceContextTest, TheClientMakesAFreshTraceparentPerJob) {
  ServerProcess& server = SharedServer();
  Client client(server.address());
  std::set<std::string> traces;
  for (const bool stream : {false, false, true}) {
    Operands<double> ops(8, 8, v1::LAYOUT_COL_MAJOR, v1::SIDE_RIGHT, 8);
    std::vector<double> c = ops.NanOutput();
    absl::StatusOr<JobResult> r =
        stream ? client.MultiplyStream(ops.MakeJob(), c.data(), c.size() * sizeof(double))
               : client.Multiply(ops.MakeJob(), c.data(), c.size() * sizeof(double));
    ASSERT_TRUE(r.ok()) << r.status();
    std::optional<TraceContext> sent = ParseTraceparent(r->traceparent);
    ASSERT_TRUE(sent.has_value()) << r->traceparent;
    EXPECT_EQ(r->stats.trace_id(), sent->trace_id_hex());
    EXPECT_EQ(r->stats.parent_span_id(), sent->span_id_hex());
    traces.insert(sent->trace_id_hex());
  }
  EXPECT_EQ(traces.size(), 3u);
}

TEST(TraceContextTest, TheClientRefusesAnInvalidTraceparentBeforeAnyCall) {
  Client client(SharedServer().address());
  Operands<float> ops(2, 2, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 9);
  std::vector<float> c = ops.NanOutput();
  Job job = ops.MakeJob();
  for (const std::string& bad : {std::string("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
                                 std::string("ff-") + kTrace + "-" + kParent + "-01",
                                 std::string("nope")}) {
    job.traceparent = bad;
    absl::StatusOr<JobResult> r = client.Multiply(job, c.data(), c.size() * sizeof(float));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  job.traceparent = "";
  job.tracestate = kTracestate;
  EXPECT_EQ(client.Multiply(job, c.data(), c.size() * sizeof(float)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TraceContextTest, ABatchCarriesTheTraceToEachJob) {
  Client client(SharedServer().address());
  std::vector<Operands<float>> ops;
  std::vector<std::vector<float>> outs;
  for (int i = 0; i < 3; ++i) ops.emplace_back(3, 5, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 10 + i);
  for (const Operands<float>& o : ops) outs.push_back(o.NanOutput());
  std::vector<BatchItem> items;
  for (size_t i = 0; i < ops.size(); ++i) {
    items.push_back({ops[i].MakeJob(), outs[i].data(), outs[i].size() * sizeof(float)});
  }
  absl::StatusOr<BatchResult> r = client.MultiplyBatch(items, nullptr, kTraceparent);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->traceparent, kTraceparent);
  std::set<std::string> spans;
  for (const absl::StatusOr<v1::JobStats>& job : r->jobs) {
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->trace_id(), kTrace);
    EXPECT_EQ(job->parent_span_id(), kParent);
    spans.insert(job->span_id());
  }
  EXPECT_EQ(spans.size(), 1u);  // one call, one span
  EXPECT_TRUE(LogHas(SharedServer(), TraceTail("MultiplyBatch", kTrace, kParent, *spans.begin())));
  // Without one: a new traceparent for the batch.
  r = client.MultiplyBatch(items);
  ASSERT_TRUE(r.ok()) << r.status();
  std::optional<TraceContext> made = ParseTraceparent(r->traceparent);
  ASSERT_TRUE(made.has_value());
  EXPECT_EQ(r->jobs[0]->trace_id(), made->trace_id_hex());
}

TEST(TraceContextTest, ModelInferAnswersTheTraceToo) {
  ServerProcess& server = SharedServer();
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  inference::ModelInferRequest request;
  request.set_model_name("dgmm");
  (*request.mutable_parameters())["side"].set_string_param("right");
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const float d[3] = {10, 100, 1000};
  auto* ta = request.add_inputs();
  ta->set_name("A");
  ta->set_datatype("FP32");
  ta->add_shape(2);
  ta->add_shape(3);
  auto* td = request.add_inputs();
  td->set_name("d");
  td->set_datatype("FP32");
  td->add_shape(3);
  request.add_raw_input_contents()->assign(reinterpret_cast<const char*>(a), sizeof(a));
  request.add_raw_input_contents()->assign(reinterpret_cast<const char*>(d), sizeof(d));
  grpc::ClientContext context;
  context.AddMetadata("traceparent", kTraceparent);
  inference::ModelInferResponse response;
  const grpc::Status s = stub->ModelInfer(&context, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string trailer = Trailer(context, "traceparent");
  ASSERT_TRUE(ParseTraceparent(trailer).has_value()) << trailer;
  EXPECT_EQ(trailer.substr(0, 36), absl::StrCat("00-", kTrace, "-"));
  EXPECT_TRUE(LogHas(server, TraceTail("ModelInfer", kTrace, kParent, trailer.substr(36, 16))))
      << server.Log();
}

TEST(TraceContextTest, ASameHostRegionJobCarriesIt) {
  ServerProcess server({"--backend=cpu", "--threads=2", "--allow_regions"});
  ClientOptions options;
  options.same_host_min_bytes = 0;
  Client client(server.address(), options);
  Operands<float> ops(16, 16, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 20);
  Job job = ops.MakeJob();
  job.traceparent = kTraceparent;
  std::vector<float> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.Multiply(job, c.data(), c.size() * sizeof(float));
  ASSERT_TRUE(r.ok()) << r.status();
  if (r->mode != TransferMode::kRegion) {
    GTEST_SKIP() << "no same-host path here: " << r->socket_reason;
  }
  EXPECT_EQ(r->traceparent, kTraceparent);
  EXPECT_EQ(r->stats.trace_id(), kTrace);
  EXPECT_EQ(r->stats.parent_span_id(), kParent);
  EXPECT_TRUE(LogHas(server, TraceTail("MultiplyRegion", kTrace, kParent, r->stats.span_id())))
      << server.Log();
}

}  // namespace
}  // namespace dgmm
