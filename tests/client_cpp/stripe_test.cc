// Striped jobs through dgmm::Client against real dgmm-servers on
// loopback: every side x layout x dtype checked element by element against a
// float64 reference (outputs poisoned with NaN first), ragged last ranges, K
// larger than the lines, the policy functions, the server's validation and
// echo of JobHeader.group, and a group ended by its deadline or by one part's
// final error, with every reservation returned.
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dgmm/client.h"
#include "dgmm/v1/dgmm.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/operands.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;
using testing::Operands;
using testing::ServerProcess;

ServerProcess& SharedServer() {
  static ServerProcess server({"--backend=cpu", "--threads=2"});
  return server;
}

// Polls `pred` every 20 ms until it holds or `ms` have passed; its last value.
bool WaitUntil(const std::function<bool()>& pred, int ms = 10000) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

template <typename T>
double Tolerance() {
  return std::numeric_limits<T>::epsilon();
}

bool IsHexId(const std::string& id) {
  if (id.size() != 16) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Runs a striped job and checks it element by element and part by part.
template <typename T>
void CheckStriped(int64_t rows, int64_t cols, v1::Layout layout, v1::Side side, int stripes,
                  int64_t chunk_bytes, TransferMode want_mode, uint64_t seed) {
  SCOPED_TRACE(absl::StrCat(rows, "x", cols, sizeof(T) == 4 ? " f32" : " f64",
                            layout == v1::LAYOUT_ROW_MAJOR ? " row" : " col",
                            side == v1::SIDE_RIGHT ? " right" : " left", " K=", stripes,
                            " chunk=", chunk_bytes));
  ClientOptions options;
  options.stripes = stripes;
  options.chunk_bytes = chunk_bytes;
  Client client(SharedServer().address(), options);
  Operands<T> ops(rows, cols, layout, side, seed);
  std::vector<T> c = ops.NanOutput();
  std::atomic<int64_t> last_received{0};
  std::atomic<int64_t> last_total{0};
  absl::StatusOr<JobResult> r =
      client.Multiply(ops.MakeJob(), c.data(), c.size() * sizeof(T),
                      [&](int64_t, int64_t received, int64_t total) {
                        last_received = received;
                        last_total = total;
                      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LE(ops.MaxRelativeError(c), Tolerance<T>());
  const int64_t lines = layout == v1::LAYOUT_ROW_MAJOR ? rows : cols;
  const int k = ChooseStripes(static_cast<int64_t>(c.size() * sizeof(T)), lines, stripes);
  EXPECT_EQ(r->stripes, k);
  EXPECT_EQ(r->attempts, k);
  EXPECT_EQ(r->mode, want_mode);
  EXPECT_EQ(r->received_bytes, static_cast<int64_t>(c.size() * sizeof(T)));
  EXPECT_EQ(last_total.load(), static_cast<int64_t>(c.size() * sizeof(T)));
  EXPECT_EQ(last_received.load(), static_cast<int64_t>(c.size() * sizeof(T)));
  const std::vector<LineRange> ranges = SplitLines(lines, k);
  ASSERT_EQ(r->part_stats.size(), ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const v1::JobStats& s = r->part_stats[i];
    if (k == 1) {
      EXPECT_FALSE(s.has_group());
      continue;
    }
    ASSERT_TRUE(s.has_group()) << "part " << i;
    EXPECT_TRUE(IsHexId(s.group().id())) << s.group().id();
    EXPECT_EQ(s.group().id(), r->part_stats[0].group().id());
    EXPECT_EQ(s.group().first_line(), ranges[i].first_line);
    EXPECT_EQ(s.group().total_lines(), lines);
    EXPECT_EQ(s.group().parts(), k);
    const int64_t line_bytes = (layout == v1::LAYOUT_ROW_MAJOR ? cols : rows) * sizeof(T);
    EXPECT_EQ(s.bytes_in(), ranges[i].lines * line_bytes) << "part " << i;
  }
}

TEST(StripeTest, EverySideLayoutDtypeUnaryParts) {
  uint64_t seed = 1;
  for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
    for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
      // 37 rows and 29 columns into 4 parts: ragged (10, 9, 9, 9 and 8, 7, 7, 7).
      CheckStriped<float>(37, 29, layout, side, 4, int64_t{4} << 20, TransferMode::kUnary,
                          seed++);
      CheckStriped<double>(37, 29, layout, side, 4, int64_t{4} << 20, TransferMode::kUnary,
                           seed++);
    }
  }
}

TEST(StripeTest, EverySideLayoutDtypeStreamedParts) {
  uint64_t seed = 100;
  for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
    for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
      // A 2 KiB chunk: every part streams, several lines per block and
      // several blocks per part; 3 parts of 203 lines: 68, 68, 67.
      CheckStriped<float>(203, 131, layout, side, 3, 2048, TransferMode::kStream, seed++);
      CheckStriped<double>(203, 131, layout, side, 3, 2048, TransferMode::kStream, seed++);
    }
  }
}

TEST(StripeTest, MoreStripesThanLines) {
  CheckStriped<float>(3, 50, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 8, int64_t{4} << 20,
                      TransferMode::kUnary, 7);
  // Columns of 320 bytes against a 64-byte chunk: a line longer than the
  // chunk, so each part goes unary (rule 1).
  CheckStriped<double>(40, 2, v1::LAYOUT_COL_MAJOR, v1::SIDE_RIGHT, 8, 64,
                       TransferMode::kUnary, 8);
  // Columns of 32 bytes against a 64-byte chunk: two lines per block, streamed.
  CheckStriped<double>(4, 40, v1::LAYOUT_COL_MAJOR, v1::SIDE_RIGHT, 8, 64,
                       TransferMode::kStream, 10);
  CheckStriped<float>(1, 10, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 5, int64_t{4} << 20,
                      TransferMode::kUnary, 9);
}

TEST(StripeTest, AutoStripesByteSize) {
  // 64 MiB of float32 (4096 x 4096): auto K = 2, streamed parts of 32 MiB.
  CheckStriped<float>(4096, 4096, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 0, int64_t{4} << 20,
                      TransferMode::kStream, 11);
}

TEST(StripeTest, SmallJobIsNotStriped) {
  Client client(SharedServer().address());
  Operands<float> ops(300, 200, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 12);
  std::vector<float> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.Multiply(ops.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stripes, 1);
  EXPECT_EQ(r->attempts, 1);
  EXPECT_FALSE(r->stats.has_group());
  EXPECT_LE(ops.MaxRelativeError(c), Tolerance<float>());
}

TEST(StripeTest, WrongDiagonalLengthIsTheServersError) {
  ClientOptions options;
  options.stripes = 4;
  Client client(SharedServer().address(), options);
  Operands<float> ops(40, 30, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 13);
  Job job = ops.MakeJob();
  job.diagonal_bytes -= 4;  // 39 of 40 elements: never sliced, never read past
  std::vector<float> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.Multiply(job, c.data(), c.size() * 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("diagonal"));
}

TEST(StripePolicyTest, PureFunctions) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  EXPECT_EQ(ChooseStripes(63 * kMiB, 1000, 0), 1);
  EXPECT_EQ(ChooseStripes(64 * kMiB, 1000, 0), 2);
  EXPECT_EQ(ChooseStripes(1600 * kMiB, 20000, 0), 8);
  EXPECT_EQ(ChooseStripes(1600 * kMiB, 5, 0), 5);
  EXPECT_EQ(ChooseStripes(kMiB, 1000, 3), 3);
  EXPECT_EQ(ChooseStripes(kMiB, 2, 3), 2);
  const std::vector<LineRange> r = SplitLines(10, 4);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].first_line, 0);
  EXPECT_EQ(r[0].lines, 3);
  EXPECT_EQ(r[1].first_line, 3);
  EXPECT_EQ(r[1].lines, 3);
  EXPECT_EQ(r[2].first_line, 6);
  EXPECT_EQ(r[2].lines, 2);
  EXPECT_EQ(r[3].first_line, 8);
  EXPECT_EQ(r[3].lines, 2);
  EXPECT_EQ(ChooseTransferMode(4 * kMiB, 16 * kMiB, 4 * kMiB), TransferMode::kUnary);
  EXPECT_EQ(ChooseTransferMode(4 * kMiB + 1, 16 * kMiB, 4 * kMiB), TransferMode::kStream);
  EXPECT_EQ(ChooseTransferMode(3 * kMiB, 2 * kMiB, 4 * kMiB), TransferMode::kStream);
  // A line longer than the chunk fits no block the server takes: unary up
  // to U - 64 KiB (2 x 600000 float64: 9.6 MB in lines of 4.8 MB), else stream.
  EXPECT_EQ(ChooseTransferMode(9600016, 16 * kMiB, 4 * kMiB, 4800000), TransferMode::kUnary);
  EXPECT_EQ(ChooseTransferMode(16 * kMiB - 64 * 1024, 16 * kMiB, 4 * kMiB, 5 * kMiB),
            TransferMode::kUnary);
  EXPECT_EQ(ChooseTransferMode(16 * kMiB - 64 * 1024 + 1, 16 * kMiB, 4 * kMiB, 5 * kMiB),
            TransferMode::kStream);
  EXPECT_EQ(ChooseTransferMode(9600016, 16 * kMiB, 4 * kMiB, 4 * kMiB), TransferMode::kStream);
  EXPECT_EQ(*ParseBackendName("auto"), v1::BACKEND_AUTO);
  EXPECT_EQ(*ParseBackendName("cuda-kernel"), v1::BACKEND_CUDA_KERNEL);
  EXPECT_EQ(*ParseBackendName("BACKEND_CUBLAS"), v1::BACKEND_CUBLAS);
  EXPECT_EQ(*ParseBackendName("cpu"), v1::BACKEND_CPU);
  for (const char* bad : {"cuda_kernel", "cuda", "CPU", "", "BACKEND_FOO"}) {
    EXPECT_EQ(ParseBackendName(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  ClientOptions options;
  options.stripes = -1;
  EXPECT_THAT(Client::Create("127.0.0.1:1", options).status().message(), HasSubstr("stripes"));
}

TEST(StripeCliTest, StripesFlagIsPrintedBeforeTheJobAndUsed) {
  std::string out;
  const std::string base = absl::StrCat(testing::CliBinary(), " multiply --server=",
                                        SharedServer().address(), " --random=300 --cols=100");
  ASSERT_EQ(testing::RunCommand(base + " --stripes=3 --check --backend=cpu", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("stripes:    3 (--stripes), mode unary"));
  EXPECT_THAT(out, HasSubstr("mode:       unary, 3 stripes, 3 attempts"));
  EXPECT_THAT(out, HasSubstr("max relative error"));
  EXPECT_LT(out.find("stripes:    3"), out.find("job "));
  // Auto: a 120 KB job is not striped.
  ASSERT_EQ(testing::RunCommand(base + " --backend=BACKEND_CPU", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("stripes:    1 (auto), mode unary"));
  // Backend names per the policy: anything else is refused before any call.
  for (const char* bad : {"cuda_kernel", "cuda", "gpu"}) {
    ASSERT_EQ(testing::RunCommand(absl::StrCat(base, " --backend=", bad), &out), 2) << out;
    EXPECT_THAT(out, HasSubstr("INVALID_ARGUMENT")) << bad;
  }
  ASSERT_EQ(testing::RunCommand(base + " --stripes=-1", &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("stripes"));
}

// A unary request with `group`, sent with the generated stub.
grpc::Status SendGroup(const v1::JobGroup& group, v1::MultiplyResponse* response) {
  auto stub = v1::Dgmm::NewStub(
      grpc::CreateChannel(SharedServer().address(), grpc::InsecureChannelCredentials()));
  Operands<float> ops(6, 5, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 14);
  v1::MultiplyRequest request;
  v1::JobHeader* h = request.mutable_header();
  h->set_rows(6);
  h->set_cols(5);
  h->set_dtype(v1::DTYPE_FLOAT32);
  h->set_layout(v1::LAYOUT_ROW_MAJOR);
  h->set_side(v1::SIDE_RIGHT);
  h->set_diagonal(ops.d.data(), ops.d.size() * 4);
  *h->mutable_group() = group;
  request.set_matrix(ops.a.data(), ops.a.size() * 4);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return stub->Multiply(&context, request, response);
}

TEST(StripeServerTest, ValidatesAndEchoesTheGroup) {
  v1::JobGroup good;
  good.set_id("Ab0._-z");
  good.set_first_line(4);
  good.set_total_lines(10);
  good.set_parts(3);
  v1::MultiplyResponse response;
  grpc::Status s = SendGroup(good, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.stats().group().id(), "Ab0._-z");
  EXPECT_EQ(response.stats().group().first_line(), 4);
  EXPECT_EQ(response.stats().group().total_lines(), 10);
  EXPECT_EQ(response.stats().group().parts(), 3);

  struct Bad {
    std::string id;
    int64_t first_line, total_lines;
    int parts;
    const char* field;
  };
  const std::vector<Bad> bad = {
      {"", 0, 6, 1, "group.id"},
      {std::string(65, 'a'), 0, 6, 1, "group.id"},
      {"a b", 0, 6, 1, "group.id"},
      {"a/b", 0, 6, 1, "group.id"},
      {"ok", -1, 6, 1, "group.first_line"},
      {"ok", 1, 6, 1, "group.total_lines"},
      {"ok", 0, 5, 1, "group.total_lines"},
      {"ok", 0, 6, 0, "group.parts"},
      {"ok", 0, 6, -2, "group.parts"},
  };
  for (const Bad& b : bad) {
    v1::JobGroup g;
    g.set_id(b.id);
    g.set_first_line(b.first_line);
    g.set_total_lines(b.total_lines);
    g.set_parts(b.parts);
    grpc::Status s = SendGroup(g, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.field;
    EXPECT_THAT(s.error_message(), HasSubstr(b.field));
  }
  // 64 characters is the longest id.
  good.set_id(std::string(64, 'x'));
  EXPECT_TRUE(SendGroup(good, &response).ok());
  // The log names the group and the part's line range.
  EXPECT_TRUE(WaitUntil(
      [] { return SharedServer().Log().find("group Ab0._-z lines [4,10) of 10 (3 parts): completed") !=
                  std::string::npos; }))
      << SharedServer().Log();
}

TEST(StripeServerTest, GroupPartsAreCountedByOutcomeInMetrics) {
  ServerProcess server({"--backend=cpu", "--threads=2", "--metrics_listen=127.0.0.1:0"});
  ClientOptions options;
  options.stripes = 3;
  Client client(server.address(), options);
  Operands<float> ops(30, 20, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT, 15);
  std::vector<float> c = ops.NanOutput();
  ASSERT_TRUE(client.Multiply(ops.MakeJob(), c.data(), c.size() * 4).ok());
  EXPECT_LE(ops.MaxRelativeError(c), Tolerance<float>());
  // A job that is not striped is no group's part.
  Client plain(server.address());
  ASSERT_TRUE(plain.Multiply(ops.MakeJob(), c.data(), c.size() * 4).ok());
  const std::string log = server.Log();
  const size_t at = log.find("/metrics (port ");
  ASSERT_NE(at, std::string::npos) << log;
  std::string body;
  ASSERT_EQ(testing::RunCommand(absl::StrCat("curl -sf http://127.0.0.1:",
                                             std::stoi(log.substr(at + 15)), "/metrics"),
                                &body),
            0)
      << body;
  EXPECT_THAT(body, HasSubstr("# TYPE dgmm_group_parts_total counter"));
  EXPECT_THAT(body, HasSubstr("dgmm_group_parts_total{outcome=\"completed\"} 3\n"));
  // No label carries a group id.
  EXPECT_EQ(body.find("group=\""), std::string::npos);
}

// Completed jobs the server at `log`'s metrics port counted with `mode`
// ("unary" or "stream"); -1 when the metrics cannot be read.
int64_t CompletedJobs(const std::string& log, const std::string& mode) {
  const size_t at = log.find("/metrics (port ");
  if (at == std::string::npos) return -1;
  std::string body;
  if (testing::RunCommand(
          absl::StrCat("curl -sf http://127.0.0.1:", std::stoi(log.substr(at + 15)), "/metrics"),
          &body) != 0) {
    return -1;
  }
  const std::string key = absl::StrCat("dgmm_job_duration_seconds_count{mode=\"", mode, "\"} ");
  const size_t line = body.find(key);
  return line == std::string::npos ? -1 : std::stoll(body.substr(line + key.size()));
}

// JobResult::mode is kUnary only when every attempt of every part went as one
// Multiply (docs/protocol.md section 9, as in the Python and Node clients): a
// striped job whose longest part streams while the others go unary is
// kStream; the server's own count of unary and streamed jobs shows the parts
// did go both ways.
TEST(StripeTest, ModeIsStreamWhenAnyPartStreamed) {
  ServerProcess server({"--backend=cpu", "--threads=2", "--metrics_listen=127.0.0.1:0"});
  // 37 x 29 float32, row-major, side right, K = 4: parts of 10, 9, 9 and 9
  // rows of 116 bytes, each sent with the whole 116-byte diagonal (it runs
  // across the rows, so parts do not slice it): 1276 and 1160 bytes.
  constexpr int64_t kChunk = 1200;
  const int64_t max_unary = ClientOptions().max_unary_message_bytes;
  ASSERT_EQ(ChooseTransferMode(10 * 116 + 116, max_unary, kChunk), TransferMode::kStream);
  ASSERT_EQ(ChooseTransferMode(9 * 116 + 116, max_unary, kChunk), TransferMode::kUnary);
  ClientOptions options;
  options.stripes = 4;
  options.chunk_bytes = kChunk;
  Client client(server.address(), options);
  Operands<float> ops(37, 29, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 41);
  std::vector<float> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.Multiply(ops.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LE(ops.MaxRelativeError(c), Tolerance<float>());
  EXPECT_EQ(r->stripes, 4);
  EXPECT_EQ(r->attempts, 4);
  EXPECT_EQ(r->mode, TransferMode::kStream);
  // (Counted as each job ends, which may be just after its reply went.)
  EXPECT_TRUE(WaitUntil([&] {
    return CompletedJobs(server.Log(), "unary") == 3 && CompletedJobs(server.Log(), "stream") == 1;
  })) << "unary " << CompletedJobs(server.Log(), "unary") << ", stream "
      << CompletedJobs(server.Log(), "stream");

  // The same job with a chunk every part fits in: all unary, kUnary.
  options.chunk_bytes = 2000;
  Client all_unary(server.address(), options);
  c = ops.NanOutput();
  r = all_unary.Multiply(ops.MakeJob(), c.data(), c.size() * 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LE(ops.MaxRelativeError(c), Tolerance<float>());
  EXPECT_EQ(r->mode, TransferMode::kUnary);
  EXPECT_TRUE(WaitUntil([&] {
    return CompletedJobs(server.Log(), "unary") == 7 && CompletedJobs(server.Log(), "stream") == 1;
  })) << "unary " << CompletedJobs(server.Log(), "unary") << ", stream "
      << CompletedJobs(server.Log(), "stream");
}

// Sum of reserved bytes and of running and queued jobs over the devices.
struct Load {
  int64_t reserved = 0, running = 0, queued = 0;
};
Load ServerLoad(const std::string& address) {
  Client client(address);
  Load load;
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  if (!info.ok()) return {-1, -1, -1};
  for (const v1::DeviceInfo& d : info->devices()) {
    load.reserved += d.reserved_bytes();
    load.running += d.running_jobs();
    load.queued += d.queued_jobs();
  }
  return load;
}

bool WaitIdle(const std::string& address) {
  return WaitUntil([&] {
    const Load l = ServerLoad(address);
    return l.reserved == 0 && l.running == 0 && l.queued == 0;
  }, 15000);
}

TEST(StripeGroupEndTest, DeadlineEndsEveryPartAndReturnsEveryReservation) {
  // Budget for two streamed parts (64 KiB blocks: 4-block windows of 512
  // KiB each, plus the diagonal): of 4 parts, 2 run and 2 wait.
  ServerProcess server({"--backend=cpu", "--threads=2", "--max_block_bytes=65536",
                        "--host_memory_budget=1200000", "--max_client_share_percent=100"});
  ClientOptions options;
  options.stripes = 4;
  options.chunk_bytes = 65536;
  options.deadline = absl::Milliseconds(1500);
  Client client(server.address(), options);
  Operands<float> ops(2048, 512, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 21);
  std::vector<float> c = ops.NanOutput();
  std::atomic<bool> saw_running{false};
  std::atomic<bool> saw_queued{false};
  // A slow consumer: every progress report takes 50 ms, so the job cannot
  // finish within its deadline; meanwhile the server's load is sampled.
  std::thread sampler([&] {
    for (int i = 0; i < 100; ++i) {
      const Load l = ServerLoad(server.address());
      if (l.running >= 2) saw_running = true;
      if (l.queued >= 1) saw_queued = true;
      if (saw_running && saw_queued) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<JobResult> r =
      client.Multiply(ops.MakeJob(), c.data(), c.size() * 4, [](int64_t, int64_t, int64_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  sampler.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(saw_running.load());
  EXPECT_TRUE(saw_queued.load());
  EXPECT_TRUE(WaitIdle(server.address())) << server.Log();
  // Every part ended on the server: 4 group lines, none completed.
  EXPECT_TRUE(WaitUntil([&] {
    const std::string log = server.Log();
    size_t n = 0;
    for (size_t at = log.find(" parts): "); at != std::string::npos;
         at = log.find(" parts): ", at + 1)) {
      ++n;
    }
    return n >= 4;
  })) << server.Log();
  EXPECT_EQ(server.Log().find("(4 parts): completed"), std::string::npos) << server.Log();
}

TEST(StripeGroupEndTest, OnePartsFinalErrorCancelsTheOthers) {
  // The budget holds one part (a streamed part needs 33558528 bytes) and
  // the queue one more: of 4 parts sent at once, one runs, one waits and the
  // others are refused at once (queue full, and this client has the most
  // waiting) with RESOURCE_EXHAUSTED, final with max_attempts = 1. That
  // error is the job's status, and the parts still running or waiting are
  // cancelled.
  ServerProcess server({"--backend=cpu", "--threads=2", "--max_queue=1",
                        "--host_memory_budget=40MiB"});
  ClientOptions options;
  options.stripes = 4;
  options.retry.max_attempts = 1;
  Client client(server.address(), options);
  // 32 MiB: 4 streamed parts of 8 MiB, each far longer than the parts'
  // headers take to arrive.
  Operands<float> ops(4096, 2048, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 22);
  std::vector<float> c = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.Multiply(ops.MakeJob(), c.data(), c.size() * 4);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("queue is full"));
  // Every part made one attempt (or was cancelled before making one).
  EXPECT_GE(AttemptsOf(r.status()), 1);
  EXPECT_LE(AttemptsOf(r.status()), 4);
  // Every part that reached the server ended there and gave its reservation
  // back (a part cancelled before its header arrived never reached it).
  EXPECT_TRUE(WaitIdle(server.address())) << server.Log();
  const std::string log = server.Log();
  size_t ended = 0;
  size_t completed = 0;
  for (size_t at = log.find("(4 parts): "); at != std::string::npos;
       at = log.find("(4 parts): ", at + 1)) {
    ++ended;
    if (log.compare(at + 11, 9, "completed") == 0) ++completed;
  }
  EXPECT_GE(ended, 2u) << log;
  EXPECT_THAT(log, HasSubstr("(4 parts): queue_full (RESOURCE_EXHAUSTED"));
  EXPECT_LT(completed, 4u) << server.Log();
}


// The job ids (admission order) of the parts of group `id` in a server log.
std::vector<int64_t> GroupJobIds(const std::string& log, const std::string& id) {
  std::vector<int64_t> ids;
  const std::string key = absl::StrCat(" group ", id, " lines [");
  for (size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
    const size_t job = log.rfind("dgmm: job ", at);
    ids.push_back(std::stoll(log.substr(job + 10, at - job - 10)));
  }
  return ids;
}

TEST(StripeAdmissionTest, StartedGroupIsNotStarvedByOtherGroups) {
  // Three fair-share clients (one bearer token each). The budget holds two
  // streamed parts. Group G (client 1) starts: two parts run, two wait.
  // Then groups H and I (clients 2 and 3) queue 4 parts each. Under the
  // clients-in-turn order alone, H's and I's first parts (rank 0) would go
  // ahead of G's waiting parts (rank 1 and 2 while G has a part running);
  // a started group's parts go first, so G's 4 parts are admitted (job ids
  // are given at admission) before any part of H or I.
  const std::string dir = ::testing::TempDir();
  const std::string tokens = dir + "/stripe_tokens";
  {
    FILE* f = std::fopen(tokens.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("token-g\ntoken-h\ntoken-i\n", f);
    std::fclose(f);
  }
  // A streamed part needs 2 x 4 blocks x 64 KiB plus its 8 KiB diagonal.
  ServerProcess server({"--backend=cpu", "--threads=2", "--max_block_bytes=65536",
                        "--host_memory_budget=1100000", "--max_client_share_percent=100",
                        "--auth_token_file=" + tokens, "--max_head_wait_ms=60000"});
  auto make = [&](const std::string& token) {
    ClientOptions options;
    options.stripes = 4;
    options.chunk_bytes = 65536;
    options.bearer_token = token;
    options.deadline = absl::Seconds(60);
    return std::make_unique<Client>(server.address(), options);
  };
  std::unique_ptr<Client> g = make("token-g"), h = make("token-h"), i = make("token-i");
  // G: 128 MiB in 4 parts of 32 MiB, each long enough for H and I to queue.
  Operands<float> g_ops(16384, 2048, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 31);
  Operands<float> h_ops(1024, 2048, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 32);
  Operands<float> i_ops(1024, 2048, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 33);
  std::vector<float> g_out = g_ops.NanOutput(), h_out = h_ops.NanOutput(),
                     i_out = i_ops.NanOutput();
  absl::StatusOr<JobResult> g_r, h_r, i_r;
  std::thread g_thread([&] { g_r = g->Multiply(g_ops.MakeJob(), g_out.data(), g_out.size() * 4); });
  auto load = [&] {
    ClientOptions o;
    o.bearer_token = "token-g";
    Client c(server.address(), o);
    Load l;
    absl::StatusOr<v1::GetServerInfoResponse> info = c.GetServerInfo();
    if (!info.ok()) return l;
    for (const v1::DeviceInfo& d : info->devices()) {
      l.running += d.running_jobs();
      l.queued += d.queued_jobs();
    }
    return l;
  };
  ASSERT_TRUE(WaitUntil([&] {
    const Load l = load();
    return l.running == 2 && l.queued == 2;
  }, 20000)) << server.Log();
  std::thread h_thread([&] { h_r = h->Multiply(h_ops.MakeJob(), h_out.data(), h_out.size() * 4); });
  std::thread i_thread([&] { i_r = i->Multiply(i_ops.MakeJob(), i_out.data(), i_out.size() * 4); });
  // Every part of H and I waits while G still has parts waiting.
  bool all_queued = WaitUntil([&] { return load().queued == 10; }, 20000);
  g_thread.join();
  h_thread.join();
  i_thread.join();
  ASSERT_TRUE(all_queued) << "H and I did not queue while G had parts waiting; " << server.Log();
  ASSERT_TRUE(g_r.ok()) << g_r.status();
  ASSERT_TRUE(h_r.ok()) << h_r.status();
  ASSERT_TRUE(i_r.ok()) << i_r.status();
  EXPECT_LE(g_ops.MaxRelativeError(g_out), Tolerance<float>());
  EXPECT_LE(h_ops.MaxRelativeError(h_out), Tolerance<float>());
  EXPECT_LE(i_ops.MaxRelativeError(i_out), Tolerance<float>());
  const std::string log = server.Log();
  const std::vector<int64_t> g_ids = GroupJobIds(log, g_r->stats.group().id());
  std::vector<int64_t> others = GroupJobIds(log, h_r->stats.group().id());
  for (int64_t id : GroupJobIds(log, i_r->stats.group().id())) others.push_back(id);
  ASSERT_EQ(g_ids.size(), 4u) << log;
  ASSERT_EQ(others.size(), 8u) << log;
  EXPECT_LT(*std::max_element(g_ids.begin(), g_ids.end()),
            *std::min_element(others.begin(), others.end()))
      << log;
}

}  // namespace
}  // namespace dgmm
