// Admission through the real server: budgets, rejection, FIFO queue,
// backpressure, deadlines, cancellation, no leaks, metrics and drain.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Budget arithmetic for the servers below (CPU backend, 64 KiB blocks): a
// streamed job holds 2 * 4 * 64 KiB = 512 KiB plus its diagonal; a unary
// 200x200 float32 job holds 2 * 160000 + 800 = 320800 bytes. A 560 KiB
// budget holds one of either, never two.
const std::vector<std::string> kTightBudget = {"--backend=cpu", "--max_block_bytes=64KiB",
                                               "--host_memory_budget=560KiB"};

TEST(AdmissionServer, OriginalQuestionUnary8000FitsAnd15000IsRejectedWithStreamingAdvice) {
  ServerProcess server({"--backend=cpu", "--host_memory_budget=1GiB",
                        "--max_unary_message_bytes=1GiB"});
  auto stub = Connect(server.address());
  RandomJob ok = MakeJob(8000, 8000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1);
  v1::MultiplyResponse resp;
  grpc::Status s = UnaryJob(stub.get(), ok, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LE(MaxRelError(ok, resp.result()), 1.2e-7);

  RandomJob big = MakeJob(15000, 15000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 2);
  s = UnaryJob(stub.get(), big, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // Needs 2 * 15000^2 * 4 + 15000 * 4 bytes; the budget is 2^30, and
  // 2 * 11584^2 * 4 + 4 * 11584 = 1073558784 fits while N = 11585 does not.
  EXPECT_NE(s.error_message().find("needs 1800060000 bytes"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("capacity is 1073741824 bytes"), std::string::npos);
  EXPECT_NE(s.error_message().find("N=11584"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("use MultiplyStream"), std::string::npos);
  EXPECT_EQ(Rejected(stub.get(), "too_large"), 1);

  // The same N=15000 through dgmm-cli, which streams it, computed and checked.
  std::string out;
  const int rc = RunCommand(CliBinary() + " multiply --random 15000 --dtype f32 --check "
                                          "--server " + server.address(),
                            &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("stream"), std::string::npos) << out;
  EXPECT_EQ(Reserved(stub.get()), 0);
}

TEST(AdmissionServer, StreamThatCanNeverFitIsRejectedFromItsHeaderWithoutReadingPayload) {
  ServerProcess server({"--backend=cpu", "--max_block_bytes=64KiB", "--host_memory_budget=100KiB"});
  auto stub = Connect(server.address());
  const long rss_before = server.PeakRssBytes();
  RandomJob job = MakeJob(3000, 3000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 3);
  const auto start = Clock::now();
  grpc::Status s = StreamJob(stub.get(), job, 5, nullptr, nullptr);
  const auto elapsed = Clock::now() - start;
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("needs 536288 bytes"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("capacity is 102400 bytes"), std::string::npos);
  std::printf("rejection took %.1f ms\n",
              std::chrono::duration<double, std::milli>(elapsed).count());
  EXPECT_LT(elapsed, std::chrono::seconds(2));
  // 36 MB of payload were offered; the server's peak memory did not take it in.
  EXPECT_LT(server.PeakRssBytes() - rss_before, 16L << 20);
  EXPECT_EQ(Rejected(stub.get(), "too_large"), 1);
  EXPECT_EQ(Reserved(stub.get()), 0);
}

TEST(AdmissionServer, QueueIsFifoAndAFullQueueAnswersAtOnceWithRetryPushback) {
  std::vector<std::string> flags = kTightBudget;
  flags.push_back("--max_queue=3");
  ServerProcess server(flags);
  auto stub = Connect(server.address());
  auto holder = std::make_unique<HeldStream>(stub.get(), 4, 4);
  ASSERT_TRUE(holder->accepted());
  ASSERT_EQ(Reserved(stub.get()), 2 * 4 * 65536 + 16);

  std::vector<RandomJob> jobs;
  std::vector<std::future<std::pair<grpc::Status, v1::MultiplyResponse>>> replies;
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(MakeJob(200, 200, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 10 + i));
  }
  for (int i = 0; i < 3; ++i) {
    replies.push_back(std::async(std::launch::async, [&, i] {
      v1::MultiplyResponse r;
      grpc::Status s = UnaryJob(stub.get(), jobs[i], &r);
      return std::make_pair(s, r);
    }));
    ASSERT_TRUE(WaitUntil([&] { return Queued(stub.get()) == i + 1; })) << "job " << i;
  }
  // The fourth finds the queue full.
  grpc::ClientContext ctx;
  v1::MultiplyResponse r;
  const auto start = Clock::now();
  grpc::Status full = UnaryJob(stub.get(), jobs[0], &r, &ctx);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  ASSERT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.error_message();
  EXPECT_NE(full.error_message().find("admission queue is full"), std::string::npos);
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto hint = trailers.find("grpc-retry-pushback-ms");
  ASSERT_NE(hint, trailers.end());
  EXPECT_GT(std::stoll(std::string(hint->second.data(), hint->second.size())), 0);
  EXPECT_EQ(Rejected(stub.get(), "queue_full"), 1);

  ASSERT_TRUE(holder->Finish().ok());
  uint64_t last_id = 0;
  for (int i = 0; i < 3; ++i) {
    auto [s, resp] = replies[i].get();
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LE(MaxRelError(jobs[i], resp.result()), 1.2e-7);
    EXPECT_GT(resp.stats().job_id(), last_id) << "job " << i << " was admitted out of order";
    EXPECT_GT(resp.stats().queue_wait_ns(), 0);
    last_id = resp.stats().job_id();
  }
  EXPECT_TRUE(WaitUntil([&] { return Reserved(stub.get()) == 0; }));
}

TEST(AdmissionServer, DeadlineExpiringWhileQueuedEndsJobWithDeadlineExceeded) {
  ServerProcess server(kTightBudget);
  auto stub = Connect(server.address());
  HeldStream holder(stub.get(), 4, 4);
  ASSERT_TRUE(holder.accepted());
  RandomJob job = MakeJob(200, 200, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 4);
  // Long enough to be seen queued on a loaded machine, short enough to expire
  // behind the holder.
  auto reply = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::MultiplyResponse resp;
    return UnaryJob(stub.get(), job, &resp, &ctx).error_code();
  });
  ASSERT_TRUE(WaitUntil([&] { return Queued(stub.get()) == 1; }));
  EXPECT_EQ(reply.get(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitUntil([&] { return Rejected(stub.get(), "deadline") == 1; }));
  EXPECT_EQ(Queued(stub.get()), 0);
  ASSERT_TRUE(holder.Finish().ok());
  EXPECT_TRUE(WaitUntil([&] { return Reserved(stub.get()) == 0; }));
}

TEST(AdmissionServer, CancellingQueuedAndMidStreamJobsReturnsTheirReservations) {
  ServerProcess server(kTightBudget);
  auto stub = Connect(server.address());
  {
    HeldStream holder(stub.get(), 4, 4);
    ASSERT_TRUE(holder.accepted());
    // A second stream waits for admission behind the holder; cancel it.
    grpc::ClientContext ctx;
    auto queued = stub->MultiplyStream(&ctx);
    RandomJob job = MakeJob(10, 10, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 5);
    v1::MultiplyStreamRequest h;
    *h.mutable_header() = job.header;
    ASSERT_TRUE(queued->Write(h));
    ASSERT_TRUE(WaitUntil([&] { return Queued(stub.get()) == 1; }));
    ctx.TryCancel();
    EXPECT_EQ(queued->Finish().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_TRUE(WaitUntil([&] { return Queued(stub.get()) == 0; }));
    EXPECT_TRUE(WaitUntil([&] { return Rejected(stub.get(), "cancelled") == 1; }));
    ASSERT_TRUE(holder.Finish().ok());
  }
  // A large streamed job cancelled after some of its blocks were computed.
  RandomJob big = MakeJob(2000, 3000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 6);
  grpc::ClientContext ctx;
  auto stream = stub->MultiplyStream(&ctx);
  v1::MultiplyStreamRequest h;
  *h.mutable_header() = big.header;
  ASSERT_TRUE(stream->Write(h));
  v1::MultiplyStreamResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_TRUE(resp.has_accepted());
  const int64_t row = 3000 * 4;
  for (int64_t first = 0; first < 20; first += 5) {
    v1::MultiplyStreamRequest b;
    b.mutable_block()->set_first_line(first);
    b.mutable_block()->set_data(big.matrix.substr(first * row, 5 * row));
    ASSERT_TRUE(stream->Write(b));
  }
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_TRUE(resp.has_block());
  EXPECT_GT(Reserved(stub.get()), 0);
  ctx.TryCancel();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitUntil([&] { return Reserved(stub.get()) == 0; }));
  EXPECT_TRUE(WaitUntil([&] { return Rejected(stub.get(), "cancelled") == 2; }));
  // The server still computes.
  std::string result;
  ASSERT_TRUE(StreamJob(stub.get(), big, 5, &result, nullptr).ok());
  EXPECT_LE(MaxRelError(big, result), 1.2e-7);
}

TEST(AdmissionServer, ThousandMixedJobsFromSixteenClientsLeaveNothingReserved) {
  // Room for a few jobs at once, so that jobs queue, and a short queue, so
  // that some find it full.
  ServerProcess server({"--backend=cpu", "--max_block_bytes=64KiB", "--host_memory_budget=2MiB",
                        "--max_queue=12", "--max_head_wait_ms=50", "--max_dim=4096"});
  const std::string address = server.address();
  std::atomic<int> ok{0}, wrong{0}, expected_errors{0}, unexpected{0}, valid_sent{0};
  std::mutex log_mu;
  std::string unexpected_log;
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&, c] {
      auto stub = Connect(address);
      for (int i = 0; i < 63 && (c * 63 + i) < 1000; ++i) {
        const int kind = (c * 63 + i) % 10;
        const uint64_t seed = c * 1000 + i;
        const int64_t rows = 1 + (seed * 7919) % 120, cols = 1 + (seed * 104729) % 150;
        const auto dtype = seed % 2 ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT64;
        const auto side = seed % 3 ? v1::SIDE_RIGHT : v1::SIDE_LEFT;
        const auto layout = seed % 5 ? v1::LAYOUT_ROW_MAJOR : v1::LAYOUT_COL_MAJOR;
        RandomJob job = MakeJob(rows, cols, dtype, layout, side, seed);
        grpc::ClientContext ctx;
        grpc::Status s;
        std::string result;
        v1::MultiplyResponse resp;
        bool valid = false;
        if (kind <= 3) {  // valid unary
          valid = true;
          s = UnaryJob(stub.get(), job, &resp, &ctx);
          result = resp.result();
        } else if (kind <= 5) {  // valid streamed
          valid = true;
          s = StreamJob(stub.get(), job, 1 + seed % 17, &result, nullptr, &ctx);
        } else if (kind == 6) {  // oversized: over --max_dim
          job.header.set_rows(5000);
          s = UnaryJob(stub.get(), job, &resp, &ctx);
        } else if (kind == 7) {  // oversized: over the budget
          RandomJob big = MakeJob(600, 600, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, side, seed);
          s = UnaryJob(stub.get(), big, &resp, &ctx);
        } else if (kind == 8) {  // cancelled mid-flight
          std::thread canceller([&ctx] {
            std::this_thread::sleep_for(std::chrono::microseconds(300));
            ctx.TryCancel();
          });
          s = StreamJob(stub.get(), job, 1, &result, nullptr, &ctx);
          canceller.join();
          if (s.ok()) valid = true;  // finished before the cancel landed
        } else {  // timed out
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(500));
          s = StreamJob(stub.get(), job, 1, &result, nullptr, &ctx);
          if (s.ok()) valid = true;
        }
        if (valid) valid_sent++;
        if (s.ok()) {
          if (MaxRelError(job, result) <= (dtype == v1::DTYPE_FLOAT32 ? 1.2e-7 : 2.3e-16)) {
            ok++;
          } else {
            wrong++;
          }
          continue;
        }
        const auto code = s.error_code();
        const bool fine =
            code == grpc::StatusCode::RESOURCE_EXHAUSTED ||  // queue full or too large
            (kind == 8 && code == grpc::StatusCode::CANCELLED) ||
            (kind == 9 && code == grpc::StatusCode::DEADLINE_EXCEEDED);
        if (fine) {
          expected_errors++;
        } else {
          unexpected++;
          std::lock_guard lock(log_mu);
          unexpected_log += std::to_string(kind) + ": " + std::to_string(code) + " " +
                            s.error_message() + "\n";
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  auto stub = Connect(address);
  std::printf("ok=%d wrong=%d expected_errors=%d unexpected=%d\n", ok.load(), wrong.load(),
              expected_errors.load(), unexpected.load());
  EXPECT_EQ(ok + wrong + expected_errors + unexpected, 1000);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(unexpected, 0) << unexpected_log;
  EXPECT_GT(ok, 400);
  EXPECT_TRUE(WaitUntil([&] { return Reserved(stub.get()) == 0; })) << Reserved(stub.get());
  EXPECT_EQ(Queued(stub.get()), 0);
  const v1::GetServerInfoResponse info = Info(stub.get());
  for (const auto& d : info.devices()) EXPECT_EQ(d.running_jobs(), 0);
}

// Parses Prometheus text into name{labels} -> value.
std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(AdmissionServer, MetricsEndpointIsScrapedAndMatchesServerInfo) {
  ServerProcess server({"--backend=cpu", "--metrics_listen=127.0.0.1:0"});
  auto stub = Connect(server.address());
  for (int i = 0; i < 3; ++i) {
    RandomJob job = MakeJob(50, 40, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, i);
    v1::MultiplyResponse resp;
    ASSERT_TRUE(UnaryJob(stub.get(), job, &resp).ok());
  }
  RandomJob bad = MakeJob(5, 4, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 9);
  bad.matrix.pop_back();
  v1::MultiplyResponse resp;
  ASSERT_FALSE(UnaryJob(stub.get(), bad, &resp).ok());

  // A unary job keeps its reservation until gRPC reports the reply sent
  // (the reply's buffer is the job's memory), which can be just after the
  // client has it.
  ASSERT_TRUE(WaitUntil([&] { return Reserved(stub.get()) == 0; }));
  const std::string log = server.Log();
  const auto at = log.find("/metrics (port ");
  ASSERT_NE(at, std::string::npos) << log;
  const int port = std::stoi(log.substr(at + 15));
  std::string body;
  ASSERT_EQ(RunCommand("curl -sf http://127.0.0.1:" + std::to_string(port) + "/metrics", &body), 0)
      << body;
  auto m = ParseMetrics(body);
  const std::string cpu = "{device=\"cpu\",index=\"-1\"}";
  EXPECT_EQ(m["dgmm_jobs_completed_total" + cpu], 3);
  EXPECT_EQ(m["dgmm_jobs_rejected_total{device=\"cpu\",index=\"-1\",reason=\"invalid\"}"], 1);
  EXPECT_EQ(m["dgmm_budget_reserved_bytes" + cpu], 0);
  EXPECT_EQ(m["dgmm_budget_capacity_bytes" + cpu], Info(stub.get()).devices(0).budget_bytes());
  EXPECT_EQ(m["dgmm_job_duration_seconds_count{mode=\"unary\"}"], 3);
  EXPECT_EQ(m["dgmm_job_duration_seconds_bucket{mode=\"unary\",le=\"+Inf\"}"], 3);
  EXPECT_GT(m["dgmm_job_duration_seconds_sum{mode=\"unary\"}"], 0);
  EXPECT_NE(body.find("# TYPE dgmm_job_duration_seconds histogram"), std::string::npos);
}

TEST(AdmissionServer, SigtermDrainsQueuedAndRunningJobsThenExitsZero) {
  std::vector<std::string> flags = kTightBudget;
  flags.push_back("--drain_timeout_s=20");
  ServerProcess server(flags);
  auto stub = Connect(server.address());
  auto holder = std::make_unique<HeldStream>(stub.get(), 4, 4);
  ASSERT_TRUE(holder->accepted());
  RandomJob job = MakeJob(200, 200, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 8);
  auto queued = std::async(std::launch::async, [&] {
    v1::MultiplyResponse r;
    grpc::Status s = UnaryJob(stub.get(), job, &r);
    return std::make_pair(s, r);
  });
  ASSERT_TRUE(WaitUntil([&] { return Queued(stub.get()) == 1; }));
  server.Signal(SIGTERM, /*wait=*/false);

  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  EXPECT_TRUE(WaitUntil([&] {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse r;
    return health->Check(&ctx, {}, &r).ok() &&
           r.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  }, 5000));
  v1::MultiplyResponse r;
  EXPECT_EQ(UnaryJob(stub.get(), job, &r).error_code(), grpc::StatusCode::UNAVAILABLE);

  ASSERT_TRUE(holder->Finish().ok());
  auto [s, resp] = queued.get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LE(MaxRelError(job, resp.result()), 1.2e-7);
  const int status = server.WaitForExit(10000);
  ASSERT_TRUE(status != -1 && WIFEXITED(status)) << server.Log();
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(server.Log().find("drained; every job finished"), std::string::npos) << server.Log();
}

}  // namespace
}  // namespace dgmm::testing
