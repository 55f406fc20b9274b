// dgmm::Client against the real dgmm-server over loopback: unary and
// streamed jobs checked against a float64 reference computed here, mode
// selection, progress, server info, health, and errors carried with the
// server's gRPC code.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "dgmm/client.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/operands.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;
using testing::Operands;
using testing::ServerProcess;

// One server for the whole binary, started on first use.
ServerProcess& SharedServer() {
  // A static object, so that its destructor stops the server at exit.
  static ServerProcess server({"--threads=2"});
  return server;
}

// One rounding of the product: half an ulp, relative.
template <typename T>
double Tolerance() {
  return std::numeric_limits<T>::epsilon();
}

template <typename T>
void ExpectStreamedMatches(Client& client, const Operands<T>& ops) {
  std::vector<T> c = ops.NanOutput();
  absl::StatusOr<JobResult> r =
      client.MultiplyStream(ops.MakeJob(), c.data(), c.size() * sizeof(T));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mode, TransferMode::kStream);
  EXPECT_LE(ops.MaxRelativeError(c), Tolerance<T>());
  EXPECT_EQ(r->stats.bytes_in(), static_cast<int64_t>(c.size() * sizeof(T)));
  EXPECT_EQ(r->stats.bytes_out(), static_cast<int64_t>(c.size() * sizeof(T)));
  EXPECT_NE(r->stats.backend(), v1::BACKEND_AUTO);
  EXPECT_GT(r->stats.total_ns(), 0);
}

TEST(ClientIntegrationTest, UnaryRightScalesColumnsFloat32) {
  Client client(SharedServer().address());
  Operands<float> ops(37, 53, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1);
  std::vector<float> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.MultiplyUnary(ops.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mode, TransferMode::kUnary);
  EXPECT_LE(ops.MaxRelativeError(c), Tolerance<float>());
  EXPECT_FALSE(r->stats.device().empty());
}

TEST(ClientIntegrationTest, UnaryLeftScalesRowsFloat64ColumnMajor) {
  Client client(SharedServer().address());
  Operands<double> ops(41, 29, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT, 2);
  std::vector<double> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.MultiplyUnary(ops.MakeJob(), c.data(), c.size() * 8);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ops.MaxRelativeError(c), 0.0);  // float64 products are exact to the reference.
}

// Small unary jobs: those the server runs on gRPC's callback
// thread (a matrix of at most 64 KiB) and those just over, from 4 threads
// sharing one Client (each call completing on its caller's thread), each
// from fresh random operands into a NaN-poisoned output, checked against
// float64.
TEST(ClientIntegrationTest, ManySmallUnaryJobsFromSeveralThreadsMatchTheReference) {
  Client client(SharedServer().address());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&client, t] {
      for (int i = 0; i < 25; ++i) {
        const uint64_t seed = static_cast<uint64_t>(1000 * t + i);
        const v1::Layout layout = i % 2 == 0 ? v1::LAYOUT_ROW_MAJOR : v1::LAYOUT_COL_MAJOR;
        const v1::Side side = i % 3 == 0 ? v1::SIDE_LEFT : v1::SIDE_RIGHT;
        // 1x1 up to 128x128 float32 (64 KiB, the bound) and 129x128 (over).
        const int64_t rows = std::vector<int64_t>{1, 3, 100, 128, 129}[i % 5];
        const int64_t cols = std::vector<int64_t>{1, 7, 100, 128, 128}[i % 5];
        if (i % 4 == 3) {
          Operands<double> ops(rows, cols, layout, side, seed);
          std::vector<double> c = ops.NanOutput();
          absl::StatusOr<JobResult> r =
              client.MultiplyUnary(ops.MakeJob(), c.data(), c.size() * sizeof(double));
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_LE(ops.MaxRelativeError(c), Tolerance<double>()) << rows << "x" << cols;
        } else {
          Operands<float> ops(rows, cols, layout, side, seed);
          std::vector<float> c = ops.NanOutput();
          absl::StatusOr<JobResult> r =
              client.MultiplyUnary(ops.MakeJob(), c.data(), c.size() * sizeof(float));
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_LE(ops.MaxRelativeError(c), Tolerance<float>()) << rows << "x" << cols;
          EXPECT_EQ(r->stats.bytes_out(), static_cast<int64_t>(c.size() * sizeof(float)));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(ClientIntegrationTest, StreamsLargeFloat32JobRightSideMatchingReference) {
  Client client(SharedServer().address());
  ExpectStreamedMatches(client,
                        Operands<float>(2000, 3000, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 3));
}

TEST(ClientIntegrationTest, StreamsLargeFloat64JobLeftSideMatchingReference) {
  Client client(SharedServer().address());
  ExpectStreamedMatches(client,
                        Operands<double>(2000, 3000, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 4));
}

TEST(ClientIntegrationTest, StreamsColumnMajorJobsInBlocksOfWholeColumns) {
  // 64 KiB chunks of 1000-row float64 columns: 8 columns per block and a
  // short last block, so placement by first_line is exercised.
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  Client client(SharedServer().address(), options);
  ExpectStreamedMatches(client,
                        Operands<double>(1000, 333, v1::LAYOUT_COL_MAJOR, v1::SIDE_RIGHT, 5));
  ExpectStreamedMatches(client, Operands<float>(1000, 333, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT, 6));
}

TEST(ClientIntegrationTest, StreamsOneLinePerBlockWhenALineExceedsTheChunk) {
  ClientOptions options;
  options.chunk_bytes = 100;  // Less than one 50-float row.
  Client client(SharedServer().address(), options);
  ExpectStreamedMatches(client, Operands<float>(7, 50, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 7));
}

TEST(ClientIntegrationTest, MultiplyPicksUnaryUnderTheThresholdAndStreamsAbove) {
  ClientOptions options;
  options.streaming_threshold_bytes = 100 << 10;
  Client client(SharedServer().address(), options);
  Operands<float> small(100, 100, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 8);  // 40 KB
  Operands<float> large(300, 300, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 9);  // 360 KB
  std::vector<float> c = small.NanOutput();
  absl::StatusOr<JobResult> r = client.Multiply(small.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mode, TransferMode::kUnary);
  EXPECT_LE(small.MaxRelativeError(c), Tolerance<float>());
  c = large.NanOutput();
  r = client.Multiply(large.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mode, TransferMode::kStream);
  EXPECT_LE(large.MaxRelativeError(c), Tolerance<float>());
}

TEST(ClientIntegrationTest, ByDefaultJobsLargerThanOneBlockAreStreamed) {
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  Client client(SharedServer().address(), options);
  Operands<float> one_block(100, 150, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 15);   // 60 KB
  Operands<float> two_blocks(100, 200, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 16);  // 80 KB
  std::vector<float> c = one_block.NanOutput();
  absl::StatusOr<JobResult> r = client.Multiply(one_block.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mode, TransferMode::kUnary);
  c = two_blocks.NanOutput();
  r = client.Multiply(two_blocks.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mode, TransferMode::kStream);
  EXPECT_LE(two_blocks.MaxRelativeError(c), Tolerance<float>());
}

TEST(ClientIntegrationTest, StreamProgressEndsWithEverythingSentAndReceived) {
  ClientOptions options;
  options.chunk_bytes = 256 << 10;
  Client client(SharedServer().address(), options);
  Operands<float> ops(512, 1024, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 10);
  std::vector<float> c = ops.NanOutput();
  int calls = 0;
  int64_t last_sent = -1, last_received = -1, last_total = -1;
  absl::StatusOr<JobResult> r = client.MultiplyStream(
      ops.MakeJob(), c.data(), c.size() * 4, [&](int64_t sent, int64_t received, int64_t total) {
        EXPECT_GE(sent, last_sent);
        EXPECT_GE(received, last_received);
        ++calls;
        last_sent = sent;
        last_received = received;
        last_total = total;
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(calls, 8);  // 8 blocks each way.
  EXPECT_EQ(last_total, static_cast<int64_t>(c.size() * 4));
  EXPECT_EQ(last_sent, last_total);
  EXPECT_EQ(last_received, last_total);
}

TEST(ClientIntegrationTest, WrongDiagonalLengthIsInvalidArgumentInBothModes) {
  Client client(SharedServer().address());
  Operands<float> ops(20, 30, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 11);
  Job job = ops.MakeJob();
  job.diagonal_bytes -= 4;  // 29 elements for 30 columns.
  std::vector<float> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.MultiplyUnary(job, c.data(), c.size() * 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_FALSE(r.status().message().empty());
  r = client.MultiplyStream(job, c.data(), c.size() * 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

TEST(ClientIntegrationTest, ExpiredDeadlineIsDeadlineExceededInBothModes) {
  ClientOptions options;
  options.deadline = absl::Microseconds(1);
  Client client(SharedServer().address(), options);
  Operands<float> ops(300, 300, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 17);
  std::vector<float> c = ops.NanOutput();
  EXPECT_EQ(client.MultiplyUnary(ops.MakeJob(), c.data(), c.size() * 4).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(client.MultiplyStream(ops.MakeJob(), c.data(), c.size() * 4).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(ClientIntegrationTest, OutputOfTheWrongSizeIsRejectedBeforeAnyCall) {
  Client client("127.0.0.1:1");  // Never contacted.
  Operands<float> ops(4, 4, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 12);
  std::vector<float> c(15);
  absl::StatusOr<JobResult> r = client.Multiply(ops.MakeJob(), c.data(), c.size() * 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("64"));
}

TEST(ClientIntegrationTest, ServerInfoReportsVersionLimitsAndTheCpuDevice) {
  Client client(SharedServer().address());
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->version().empty());
  EXPECT_EQ(info->limits().max_unary_message_bytes(), int64_t{16} << 20);
  EXPECT_EQ(info->limits().max_block_bytes(), int64_t{4} << 20);
  bool has_cpu = false;
  for (const v1::DeviceInfo& d : info->devices()) has_cpu |= d.index() == -1;
  EXPECT_TRUE(has_cpu);
  EXPECT_NE(info->default_backend(), v1::BACKEND_AUTO);
  // Each backend once, with what it takes: the CPU's entry on any host.
  std::vector<int> backends;
  bool cpu_listed = false;
  for (const v1::BackendCapabilities& c : info->capabilities()) {
    backends.push_back(c.backend());
    if (c.backend() != v1::BACKEND_CPU) continue;
    cpu_listed = true;
    // Every dtype, both sides and SIDE_BOTH (dtype_client_test.cc
    // checks each backend's entry).
    EXPECT_THAT(c.dtypes(), ::testing::UnorderedElementsAre(
                                v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT16,
                                v1::DTYPE_BFLOAT16, v1::DTYPE_COMPLEX64, v1::DTYPE_COMPLEX128));
    EXPECT_THAT(c.sides(),
                ::testing::UnorderedElementsAre(v1::SIDE_LEFT, v1::SIDE_RIGHT, v1::SIDE_BOTH));
  }
  EXPECT_TRUE(cpu_listed);
  std::vector<int> unique = backends;
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  EXPECT_EQ(unique.size(), backends.size());
}

TEST(ClientIntegrationTest, HealthIsServingForTheServerAndTheDgmmService) {
  Client client(SharedServer().address());
  absl::StatusOr<HealthState> state = client.Health();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, grpc::health::v1::HealthCheckResponse::SERVING);
  state = client.Health("dgmm.v1.Dgmm");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(ClientIntegrationTest, NothingListeningIsUnavailable) {
  ClientOptions options;
  options.deadline = absl::Seconds(10);
  Client client("127.0.0.1:1", options);
  EXPECT_EQ(client.Health().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client.GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  Operands<float> ops(4, 4, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 13);
  std::vector<float> c = ops.NanOutput();
  EXPECT_EQ(client.MultiplyStream(ops.MakeJob(), c.data(), c.size() * 4).status().code(),
            absl::StatusCode::kUnavailable);
}

// Established TCP connections the server listening on `port` has accepted,
// from /proc/net/tcp and tcp6 (gRPC dials 127.0.0.1 from a dual-stack
// socket: an IPv4-mapped IPv6 entry). Counted by their local port, which a
// client socket elsewhere cannot share with a listening one (its remote port
// could be any number, another test's server's included).
int EstablishedTo(int port) {
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::FILE* f = std::fopen(table, "r");
    if (f == nullptr) continue;
    char line[512];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      // "sl: local_address rem_address st ...", addresses as HEX:PORT.
      char local[64], remote[64], state[8];
      if (std::sscanf(line, " %*[^:]: %63s %63s %7s", local, remote, state) != 3) continue;
      const char* colon = std::strrchr(local, ':');
      if (colon != nullptr && std::strtol(colon + 1, nullptr, 16) == port &&
          std::strcmp(state, "01") == 0) {
        ++n;
      }
    }
    std::fclose(f);
  }
  return n;
}

// Connect(K) opens the K connections a striped job uses before any call,
// without blocking; a job then runs on them. Against nothing listening it
// returns at once, and jobs still fail the usual way.
TEST(ClientIntegrationTest, ConnectOpensTheStripesConnectionsAheadOfTheJob) {
  ServerProcess server({"--threads=2"});
  const int port = std::stoi(server.address().substr(server.address().rfind(':') + 1));
  ASSERT_EQ(EstablishedTo(port), 0);
  ClientOptions options;
  options.stripes = 3;
  options.same_host = false;  // the socket's connections only
  Client client(server.address(), options);
  client.Connect(3);
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (EstablishedTo(port) < 3 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(EstablishedTo(port), 3);
  Operands<float> ops(3000, 700, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 31);
  std::vector<float> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.Multiply(ops.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stripes, 3);
  EXPECT_LE(ops.MaxRelativeError(c), Tolerance<float>());
  EXPECT_EQ(EstablishedTo(port), 3);  // the job used them: none more

  ClientOptions quick;
  quick.deadline = absl::Seconds(5);
  Client nowhere("127.0.0.1:1", quick);
  nowhere.Connect(4);
  EXPECT_EQ(nowhere.Health().status().code(), absl::StatusCode::kUnavailable);
}

// A server with small limits: a unary request over its message limit and a
// block over its block limit are refused with the contract's codes.
TEST(ClientIntegrationTest, ServerLimitsOnMessagesAndBlocksAreReportedWithTheirCodes) {
  ServerProcess small({"--threads=1", "--max_unary_message_bytes=1MiB", "--max_block_bytes=64KiB"});
  Client client(small.address());
  Operands<float> ops(512, 1024, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 14);  // 2 MiB
  std::vector<float> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.MultiplyUnary(ops.MakeJob(), c.data(), c.size() * 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  // Blocks over max_block_bytes but within the message limit break the protocol.
  ClientOptions big_blocks;
  big_blocks.chunk_bytes = 512 << 10;
  r = Client(small.address(), big_blocks).MultiplyStream(ops.MakeJob(), c.data(), c.size() * 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();

  ClientOptions fitting;
  fitting.chunk_bytes = 64 << 10;
  fitting.max_unary_message_bytes = 1 << 20;
  Client fitting_client(small.address(), fitting);
  r = fitting_client.Multiply(ops.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mode, TransferMode::kStream);
  EXPECT_LE(ops.MaxRelativeError(c), Tolerance<float>());
}

// Multiply calls that send nothing, started on a connection of their own:
// they fill the server's receive gate (room for 2 requests of 16 MiB under a
// 64 MiB budget) until the header timeout (60 s).
class SilentMultiplyCalls {
 public:
  explicit SilentMultiplyCalls(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetInt("dgmm.test.own_connection", 1);  // not shared with the Client's
    generic_ = std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    for (int i = 0; i < kCalls; ++i) {
      contexts_.push_back(std::make_unique<grpc::ClientContext>());
      calls_.push_back(
          generic_->PrepareCall(contexts_.back().get(), "/dgmm.v1.Dgmm/Multiply", &cq_));
      calls_.back()->StartCall(nullptr);
    }
    for (int i = 0; i < kCalls; ++i) {
      void* tag = nullptr;
      bool ok = false;
      cq_.Next(&tag, &ok);
    }
  }
  ~SilentMultiplyCalls() {
    for (auto& c : contexts_) c->TryCancel();
    std::vector<grpc::Status> statuses(calls_.size());
    for (size_t i = 0; i < calls_.size(); ++i) calls_[i]->Finish(&statuses[i], nullptr);
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }

 private:
  static constexpr int kCalls = 6;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericStub> generic_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<grpc::GenericClientAsyncReaderWriter>> calls_;
};

// Small unary jobs go with MultiplySmall, whose message gRPC has read
// already: they do not wait behind Multiply calls holding the receive gate.
// Against a server without the method (--multiply_small=false, as a server
// older than it) the client sends them with Multiply: they work, and wait
// at the gate like any Multiply.
TEST(ClientIntegrationTest, SmallJobsUseMultiplySmallAndFallBackToMultiply) {
  for (const bool served : {true, false}) {
    SCOPED_TRACE(served ? "MultiplySmall served" : "--multiply_small=false");
    ServerProcess server({"--backend=cpu", "--threads=1", "--stream_header_timeout_s=60",
                          "--host_memory_budget=64MiB",
                          served ? "--multiply_small=true" : "--multiply_small=false"});
    Operands<double> ops(40, 30, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 17);  // 9.6 KB
    {
      // The gate is free: the job works either way.
      Client client(server.address());
      std::vector<double> c = ops.NanOutput();
      absl::StatusOr<JobResult> r = client.Multiply(ops.MakeJob(), c.data(), c.size() * 8);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->mode, TransferMode::kUnary);
      EXPECT_LE(ops.MaxRelativeError(c), Tolerance<double>());
    }
    SilentMultiplyCalls silent(server.address());
    // Wait until the gate is full: a Multiply of this job, with a second's
    // deadline, does not get through (the silent calls reach the server on a
    // connection of their own; once they hold the gate they hold it for
    // 60 s). This is also the proof that the test tests something.
    grpc::ChannelArguments args;
    args.SetInt("dgmm.test.control", 1);
    auto stub = v1::Dgmm::NewStub(
        grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
    v1::MultiplyRequest request;
    v1::JobHeader* h = request.mutable_header();
    h->set_rows(ops.rows);
    h->set_cols(ops.cols);
    h->set_dtype(v1::DTYPE_FLOAT64);
    h->set_layout(ops.layout);
    h->set_side(ops.side);
    h->set_diagonal(ops.d.data(), ops.d.size() * sizeof(double));
    request.set_matrix(ops.a.data(), ops.a.size() * sizeof(double));
    bool gate_full = false;
    for (int i = 0; i < 20 && !gate_full; ++i) {
      v1::MultiplyResponse response;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      const grpc::Status s = stub->Multiply(&ctx, request, &response);
      gate_full = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                  s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    }
    ASSERT_TRUE(gate_full) << "the silent calls never filled the gate: this test proves nothing";
    ClientOptions short_deadline;
    short_deadline.deadline = absl::Seconds(3);
    Client client(server.address(), short_deadline);
    std::vector<double> c = ops.NanOutput();
    absl::StatusOr<JobResult> r = client.Multiply(ops.MakeJob(), c.data(), c.size() * 8);
    if (served) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_LE(ops.MaxRelativeError(c), Tolerance<double>());
    } else {
      EXPECT_TRUE(r.status().code() == absl::StatusCode::kDeadlineExceeded ||
                  r.status().code() == absl::StatusCode::kResourceExhausted)
          << r.status();
    }
  }
}

}  // namespace
}  // namespace dgmm
