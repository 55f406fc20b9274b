// The real dgmm-server over loopback: jobs, every error path with its status
// code, health and reflection.
#include <cstring>
#include <limits>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--backend=cpu", "--max_block_bytes=256KiB",
                                 "--max_unary_message_bytes=8MiB", "--max_dim=100000"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { stub_ = Connect(server_->address()); }

  static ServerProcess* server_;
  std::unique_ptr<v1::Dgmm::Stub> stub_;
};
ServerProcess* ServerTest::server_ = nullptr;

void ExpectStatus(const grpc::Status& s, grpc::StatusCode code, const std::string& fragment) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(fragment), std::string::npos)
      << "message: " << s.error_message() << "\nexpected to contain: " << fragment;
}

// Multiply and MultiplySmall: the same job, the same checks.
using JobCall = grpc::Status (*)(v1::Dgmm::Stub*, const RandomJob&, v1::MultiplyResponse*,
                                 grpc::ClientContext*);
struct Method {
  const char* name;
  JobCall call;
};
constexpr Method kUnaryMethods[] = {{"Multiply", &UnaryJob}, {"MultiplySmall", &SmallJob}};

TEST_F(ServerTest, UnaryJobsMatchReferenceForEveryDtypeLayoutAndSide) {
  uint64_t seed = 1;
  for (const Method& method : kUnaryMethods) {
    SCOPED_TRACE(method.name);
    for (auto dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
      for (auto layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
        for (auto side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
          RandomJob job = MakeJob(37, 53, dtype, layout, side, seed++);
          v1::MultiplyResponse resp;
          grpc::Status s = method.call(stub_.get(), job, &resp, nullptr);
          ASSERT_TRUE(s.ok()) << s.error_message();
          EXPECT_LE(MaxRelError(job, resp.result()), dtype == v1::DTYPE_FLOAT32 ? 1.2e-7 : 2.3e-16);
          EXPECT_EQ(resp.stats().backend(), v1::BACKEND_CPU);
          EXPECT_EQ(resp.stats().device_index(), -1);
          EXPECT_GT(resp.stats().total_ns(), 0);
          EXPECT_GE(resp.stats().total_ns(), resp.stats().compute_ns());
          EXPECT_EQ(resp.stats().bytes_in(), static_cast<int64_t>(job.matrix.size()));
        }
      }
    }
  }
}

TEST_F(ServerTest, StreamedJobOf2000x3000MatchesReference) {
  for (auto dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
    RandomJob job = MakeJob(2000, 3000, dtype, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 7);
    std::string result;
    v1::JobStats stats;
    // 256 KiB blocks: 21 rows of float32, 10 of float64; neither divides 2000.
    const int64_t block_lines = (256 << 10) / (3000 * (dtype == v1::DTYPE_FLOAT32 ? 4 : 8));
    grpc::Status s = StreamJob(stub_.get(), job, block_lines, &result, &stats);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LE(MaxRelError(job, result), dtype == v1::DTYPE_FLOAT32 ? 1.2e-7 : 2.3e-16);
    EXPECT_EQ(stats.bytes_in(), static_cast<int64_t>(job.matrix.size()));
    EXPECT_EQ(stats.bytes_out(), static_cast<int64_t>(job.matrix.size()));
  }
}

TEST_F(ServerTest, StreamedColumnMajorLeftJobMatchesReference) {
  RandomJob job = MakeJob(301, 257, v1::DTYPE_FLOAT64, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT, 9);
  std::string result;
  ASSERT_TRUE(StreamJob(stub_.get(), job, 19, &result, nullptr).ok());
  EXPECT_LE(MaxRelError(job, result), 2.3e-16);
}

TEST_F(ServerTest, UnaryErrorsAreInvalidArgumentWithWhatWasExpected) {
  for (const Method& method : kUnaryMethods) {
    SCOPED_TRACE(method.name);
    auto UnaryJob = [&](v1::Dgmm::Stub* stub, const RandomJob& job, v1::MultiplyResponse* resp) {
      return method.call(stub, job, resp, nullptr);
    };
    RandomJob good = MakeJob(4, 6, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 3);
    v1::MultiplyResponse resp;
    RandomJob bad = good;
    bad.header.set_rows(0);
    ExpectStatus(UnaryJob(stub_.get(), bad, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                 "rows and cols must both be >= 1");
    bad = good;
    bad.matrix.pop_back();
    ExpectStatus(UnaryJob(stub_.get(), bad, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                 "matrix payload has 95 bytes");
    bad = good;
    bad.header.set_side(v1::SIDE_LEFT);
    ExpectStatus(UnaryJob(stub_.get(), bad, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                 "needs 4 elements (one per row)");
    bad = good;
    bad.header.set_dtype(static_cast<v1::DType>(7));
    ExpectStatus(UnaryJob(stub_.get(), bad, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                 "unknown dtype 7");
    bad = good;
    bad.header.set_rows(int64_t{1} << 40);
    bad.header.set_cols(int64_t{1} << 40);
    ExpectStatus(UnaryJob(stub_.get(), bad, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                 "overflows");
    bad = good;
    bad.header.set_backend(v1::BACKEND_CUBLAS);
    ExpectStatus(UnaryJob(stub_.get(), bad, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                 "needs a GPU but this server has none");
  }
}

// One unary call of `method` with `bytes` as its request, as they are.
grpc::Status RawUnary(const std::string& address, const std::string& method,
                      const std::string& bytes) {
  grpc::GenericStub generic(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::Slice slice(bytes.data(), bytes.size());
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::CompletionQueue cq;
  grpc::Status status;
  auto call = generic.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  call->Finish(&response, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// Bytes that are no MultiplyRequest, sent with either method.
TEST_F(ServerTest, UnaryRequestsThatDoNotParseAreInvalidArgument) {
  for (const char* method : {"/dgmm.v1.Dgmm/Multiply", "/dgmm.v1.Dgmm/MultiplySmall"}) {
    SCOPED_TRACE(method);
    const grpc::Status status =
        RawUnary(server_->address(), method, "\xff\xff\xff\xff\x0f not a protobuf");
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
}

// MultiplySmall takes requests of at most 256 KiB (or the unary limit when
// lower); a larger one is RESOURCE_EXHAUSTED, naming the limit and the way out.
TEST_F(ServerTest, SmallMessageOverItsLimitIsResourceExhausted) {
  v1::MultiplyResponse resp;
  // 200 x 200 float64: 320000 bytes, over 262144 and under the unary 8 MiB.
  RandomJob over = MakeJob(200, 200, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 4);
  ExpectStatus(SmallJob(stub_.get(), over, &resp, nullptr), grpc::StatusCode::RESOURCE_EXHAUSTED,
               "exceeds this server's max small message of 262144 bytes; send it with Multiply");
  ASSERT_TRUE(UnaryJob(stub_.get(), over, &resp).ok());
  EXPECT_LE(MaxRelError(over, resp.result()), 2.3e-16);
  // Just under the limit: served.
  RandomJob under = MakeJob(180, 180, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 5);
  ASSERT_TRUE(SmallJob(stub_.get(), under, &resp, nullptr).ok());
  EXPECT_LE(MaxRelError(under, resp.result()), 2.3e-16);
  EXPECT_EQ(Info(stub_.get()).limits().max_small_message_bytes(), 262144);
  // A unary limit under 256 KiB is MultiplySmall's too.
  ServerProcess tight({"--backend=cpu", "--max_unary_message_bytes=64KiB"});
  auto tight_stub = Connect(tight.address());
  EXPECT_EQ(Info(tight_stub.get()).limits().max_small_message_bytes(), 65536);
  RandomJob mid = MakeJob(100, 100, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 4);
  ExpectStatus(SmallJob(tight_stub.get(), mid, &resp, nullptr),
               grpc::StatusCode::RESOURCE_EXHAUSTED,
               "exceeds this server's max small message of 65536 bytes; send it with "
               "MultiplyStream");
}

// gRPC reads a unary request whole; one over its method's limit is refused
// before it is parsed (a parse would copy it again).
TEST_F(ServerTest, ControlRequestsOverTheirLimitAreResourceExhausted) {
  // 100 KiB in an unknown field (1007): over the 64 KiB these requests take.
  const std::string big = std::string("\xfa\x3e\x80\xa0\x06", 5) + std::string(100 << 10, 'x');
  for (const char* method : {"/dgmm.v1.Dgmm/GetServerInfo", "/dgmm.v1.Dgmm/GetRegionStatus",
                             "/dgmm.v1.Dgmm/RegisterRegion"}) {
    SCOPED_TRACE(method);
    ExpectStatus(RawUnary(server_->address(), method, big), grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "exceeds the 65536 bytes this server takes for it");
  }
  // The same field in a small request is ignored, as protobuf does.
  const grpc::Status s =
      RawUnary(server_->address(), "/dgmm.v1.Dgmm/GetServerInfo", "\xfa\x3e\x03xyz");
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// --multiply_small=false: the method answers as a server older than it.
TEST_F(ServerTest, SmallMethodOffIsUnimplemented) {
  ServerProcess off({"--backend=cpu", "--multiply_small=false"});
  auto stub = Connect(off.address());
  RandomJob job = MakeJob(3, 5, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 6);
  v1::MultiplyResponse resp;
  ExpectStatus(SmallJob(stub.get(), job, &resp, nullptr), grpc::StatusCode::UNIMPLEMENTED,
               "--multiply_small=false");
  EXPECT_EQ(Info(stub.get()).limits().max_small_message_bytes(), 0);
  ASSERT_TRUE(UnaryJob(stub.get(), job, &resp).ok());
  EXPECT_LE(MaxRelError(job, resp.result()), 1.2e-7);
}

TEST_F(ServerTest, ShapeOverMaxDimIsResourceExhausted) {
  RandomJob job = MakeJob(1, 2, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 3);
  job.header.set_cols(200000);
  v1::MultiplyResponse resp;
  ExpectStatus(UnaryJob(stub_.get(), job, &resp), grpc::StatusCode::RESOURCE_EXHAUSTED,
               "exceeds this server's limit of 100000");
}

TEST_F(ServerTest, UnaryMessageOverTheLimitIsResourceExhausted) {
  RandomJob job = MakeJob(1200, 1000, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 4);
  v1::MultiplyResponse resp;  // 9.6 MB > 8 MiB
  grpc::Status s = UnaryJob(stub_.get(), job, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // Under the transport's limit (which also admits stream blocks) but over
  // the unary one: the message names the limit and the way out.
  RandomJob mid = MakeJob(100, 100, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 4);
  ServerProcess tight({"--backend=cpu", "--max_unary_message_bytes=64KiB"});
  auto tight_stub = Connect(tight.address());
  ExpectStatus(UnaryJob(tight_stub.get(), mid, &resp), grpc::StatusCode::RESOURCE_EXHAUSTED,
               "exceeds this server's max unary message of 65536 bytes");
}

// Sends raw stream messages and returns the final status.
grpc::Status RawStream(v1::Dgmm::Stub* stub, const std::vector<v1::MultiplyStreamRequest>& msgs,
                       bool half_close = true) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->MultiplyStream(&ctx);
  for (const auto& m : msgs) {
    if (!stream->Write(m)) break;
  }
  if (half_close) stream->WritesDone();
  v1::MultiplyStreamResponse resp;
  while (stream->Read(&resp)) {
  }
  return stream->Finish();
}

v1::MultiplyStreamRequest HeaderMsg(const RandomJob& job) {
  v1::MultiplyStreamRequest m;
  *m.mutable_header() = job.header;
  return m;
}

v1::MultiplyStreamRequest BlockMsg(const RandomJob& job, int64_t first, int64_t lines) {
  const int64_t line_bytes = job.header.cols() * 4;
  v1::MultiplyStreamRequest m;
  m.mutable_block()->set_first_line(first);
  m.mutable_block()->set_data(job.matrix.substr(first * line_bytes, lines * line_bytes));
  return m;
}

TEST_F(ServerTest, StreamProtocolViolationsAreInvalidArgumentAndFreeEverything) {
  RandomJob job = MakeJob(10, 8, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 5);
  using M = std::vector<v1::MultiplyStreamRequest>;
  ExpectStatus(RawStream(stub_.get(), M{BlockMsg(job, 0, 2)}), grpc::StatusCode::INVALID_ARGUMENT,
               "first message of MultiplyStream must be a header");
  ExpectStatus(RawStream(stub_.get(), M{}), grpc::StatusCode::INVALID_ARGUMENT,
               "stream closed before its header");
  ExpectStatus(RawStream(stub_.get(), M{HeaderMsg(job), BlockMsg(job, 0, 2), HeaderMsg(job)}),
               grpc::StatusCode::INVALID_ARGUMENT, "a second header arrived");
  ExpectStatus(RawStream(stub_.get(), M{HeaderMsg(job), BlockMsg(job, 0, 2), BlockMsg(job, 3, 2)}),
               grpc::StatusCode::INVALID_ARGUMENT, "block starts at row 3 but 2 rows");
  v1::MultiplyStreamRequest partial = BlockMsg(job, 0, 2);
  partial.mutable_block()->mutable_data()->pop_back();
  ExpectStatus(RawStream(stub_.get(), M{HeaderMsg(job), partial}),
               grpc::StatusCode::INVALID_ARGUMENT, "not a whole number of rows");
  ExpectStatus(RawStream(stub_.get(), M{HeaderMsg(job), BlockMsg(job, 0, 10), BlockMsg(job, 9, 1)}),
               grpc::StatusCode::INVALID_ARGUMENT, "starts at row 9 but 10 rows");
  v1::MultiplyStreamRequest extra = BlockMsg(job, 8, 2);
  extra.mutable_block()->mutable_data()->append(job.matrix.substr(0, 32));
  ExpectStatus(RawStream(stub_.get(), M{HeaderMsg(job), BlockMsg(job, 0, 8), extra}),
               grpc::StatusCode::INVALID_ARGUMENT, "but the matrix has only 10 rows");
  ExpectStatus(RawStream(stub_.get(), M{HeaderMsg(job), BlockMsg(job, 0, 4)}),
               grpc::StatusCode::INVALID_ARGUMENT, "half-closed after 4 of 10 rows");
  v1::MultiplyStreamRequest empty;
  empty.mutable_block()->set_first_line(0);
  ExpectStatus(RawStream(stub_.get(), M{HeaderMsg(job), empty}),
               grpc::StatusCode::INVALID_ARGUMENT, "block is empty");
  v1::MultiplyStreamRequest neither;
  ExpectStatus(RawStream(stub_.get(), M{HeaderMsg(job), neither}),
               grpc::StatusCode::INVALID_ARGUMENT, "neither a header nor a block");
  RandomJob wide = MakeJob(2, 70000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 6);
  ExpectStatus(RawStream(stub_.get(), M{HeaderMsg(wide)}), grpc::StatusCode::INVALID_ARGUMENT,
               "cannot be streamed in whole lines");
  // Every failed job gave its reservation back.
  EXPECT_EQ(Reserved(stub_.get()), 0);
  // And the server still computes.
  std::string result;
  ASSERT_TRUE(StreamJob(stub_.get(), job, 3, &result, nullptr).ok());
  EXPECT_LE(MaxRelError(job, result), 1.2e-7);
}

TEST_F(ServerTest, HealthAnswersServingForServerAndService) {
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (const char* service : {"", "dgmm.v1.Dgmm"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("no.such.Service");
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_EQ(health->Check(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, ReflectionListsTheServiceAndDescribesIt) {
  namespace refl = grpc::reflection::v1alpha;
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = refl::ServerReflection::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->ServerReflectionInfo(&ctx);
  refl::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  refl::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  EXPECT_NE(std::find(names.begin(), names.end(), "dgmm.v1.Dgmm"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end());
  refl::ServerReflectionRequest file;
  file.set_file_containing_symbol("dgmm.v1.Dgmm");
  ASSERT_TRUE(stream->Write(file));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_GT(resp.file_descriptor_response().file_descriptor_proto_size(), 0);
  EXPECT_NE(resp.file_descriptor_response().file_descriptor_proto(0).find("dgmm/v1/dgmm.proto"),
            std::string::npos);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServerTest, ServerInfoDescribesCpuDeviceAndLimits) {
  v1::GetServerInfoResponse info = Info(stub_.get());
  EXPECT_FALSE(info.version().empty());
  ASSERT_GE(info.devices_size(), 1);
  EXPECT_EQ(info.devices(0).index(), -1);
  EXPECT_GT(info.devices(0).budget_bytes(), 0);
  EXPECT_TRUE(info.devices(0).in_service());
  EXPECT_EQ(info.limits().max_block_bytes(), 256 << 10);
  EXPECT_EQ(info.limits().max_unary_message_bytes(), 8 << 20);
  EXPECT_EQ(info.default_backend(), v1::BACKEND_CPU);
}

}  // namespace
}  // namespace dgmm::testing
