// The real dgmm-server on the GPU: unary and streamed jobs through both GPU
// kernels, the GPU budget (the original question's scenario), and, where the
// host has several GPUs, jobs spread over all of them. Skips cleanly without
// a GPU.
#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

class ServerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (SharedDevice(CudaOptions{}, &why) == nullptr) GTEST_SKIP() << kNoGpuSkip << why;
  }
};

double Tol(v1::DType t) { return t == v1::DTYPE_FLOAT32 ? 1.2e-7 : 2.3e-16; }

TEST_F(ServerGpuTest, BothKernelsMatchReferenceUnaryAndStreamedThroughTheServer) {
  ServerProcess server({"--backend=auto", "--max_block_bytes=1MiB"});
  auto stub = Connect(server.address());
  const v1::GetServerInfoResponse info = Info(stub.get());
  ASSERT_GE(info.devices_size(), 2) << "expected the CPU and at least one GPU";
  EXPECT_EQ(info.devices(1).index(), 0);
  EXPECT_FALSE(info.devices(1).name().empty());
  EXPECT_GT(info.devices(1).budget_bytes(), 0);
  EXPECT_GT(info.devices(1).streams(), 0);
  EXPECT_NE(info.default_backend(), v1::BACKEND_CPU);
  std::printf("GPU: %s, budget %lld bytes, %d streams, default backend %s\n",
              info.devices(1).name().c_str(),
              static_cast<long long>(info.devices(1).budget_bytes()), info.devices(1).streams(),
              v1::Backend_Name(info.default_backend()).c_str());

  uint64_t seed = 100;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {1, 4097}, {3001, 1}, {517, 1031}};
  for (auto backend : {v1::BACKEND_CUDA_KERNEL, v1::BACKEND_CUBLAS}) {
    for (auto [rows, cols] : shapes) {
      for (auto dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
        for (auto layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
          for (auto side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
            RandomJob job = MakeJob(rows, cols, dtype, layout, side, seed++);
            job.header.set_backend(backend);
            SCOPED_TRACE(v1::Backend_Name(backend) + " " + std::to_string(rows) + "x" +
                         std::to_string(cols) + " " + v1::DType_Name(dtype) + " " +
                         v1::Layout_Name(layout) + " " + v1::Side_Name(side));
            v1::MultiplyResponse resp;
            grpc::Status s = UnaryJob(stub.get(), job, &resp);
            ASSERT_TRUE(s.ok()) << s.error_message();
            EXPECT_LE(MaxRelError(job, resp.result()), Tol(dtype));
            EXPECT_EQ(resp.stats().backend(), backend);
            EXPECT_GE(resp.stats().device_index(), 0);  // any GPU, never the CPU
            const int64_t lines = layout == v1::LAYOUT_COL_MAJOR ? cols : rows;
            const int64_t line_bytes = (layout == v1::LAYOUT_COL_MAJOR ? rows : cols) *
                                       (dtype == v1::DTYPE_FLOAT32 ? 4 : 8);
            const int64_t block_lines =
                std::max<int64_t>(1, std::min<int64_t>(lines / 3 + 1, (1 << 20) / line_bytes));
            std::string result;
            v1::JobStats stats;
            s = StreamJob(stub.get(), job, block_lines, &result, &stats);
            ASSERT_TRUE(s.ok()) << s.error_message();
            EXPECT_LE(MaxRelError(job, result), Tol(dtype));
            EXPECT_EQ(stats.backend(), backend);
          }
        }
      }
    }
  }
  EXPECT_EQ(Reserved(stub.get()), 0);
}

TEST_F(ServerGpuTest, LargeUnaryAndStreamedJobsOnTheGpuReportTransfers) {
  ServerProcess server({"--backend=cuda", "--max_unary_message_bytes=1GiB"});
  auto stub = Connect(server.address());
  RandomJob job = MakeJob(6000, 5000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 7);
  v1::MultiplyResponse resp;
  ASSERT_TRUE(UnaryJob(stub.get(), job, &resp).ok());
  EXPECT_LE(MaxRelError(job, resp.result()), 1.2e-7);
  EXPECT_GT(resp.stats().h2d_ns(), 0);
  EXPECT_GT(resp.stats().d2h_ns(), 0);
  EXPECT_GT(resp.stats().compute_ns(), 0);
  std::printf("unary 6000x5000 f32 on %s: h2d %.2f ms, compute %.2f ms, d2h %.2f ms, total %.2f ms\n",
              resp.stats().device().c_str(), resp.stats().h2d_ns() / 1e6,
              resp.stats().compute_ns() / 1e6, resp.stats().d2h_ns() / 1e6,
              resp.stats().total_ns() / 1e6);
  std::string result;
  v1::JobStats stats;
  ASSERT_TRUE(StreamJob(stub.get(), job, 200, &result, &stats).ok());
  EXPECT_LE(MaxRelError(job, result), 1.2e-7);
  std::printf("streamed: total %.2f ms over %lld bytes each way\n", stats.total_ns() / 1e6,
              static_cast<long long>(stats.bytes_in()));
}

TEST_F(ServerGpuTest, OriginalQuestionOnTheGpuBudget) {
  ServerProcess server({"--backend=cuda", "--gpu_memory_budget=1GiB",
                        "--max_unary_message_bytes=2GiB", "--host_memory_budget=16GiB"});
  auto stub = Connect(server.address());
  RandomJob ok = MakeJob(8000, 8000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1);
  v1::MultiplyResponse resp;
  grpc::Status s = UnaryJob(stub.get(), ok, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LE(MaxRelError(ok, resp.result()), 1.2e-7);
  EXPECT_GE(resp.stats().device_index(), 0);

  RandomJob big = MakeJob(15000, 15000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 2);
  s = UnaryJob(stub.get(), big, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("of GPU memory"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("capacity is 1073741824 bytes"), std::string::npos);
  EXPECT_NE(s.error_message().find("use MultiplyStream"), std::string::npos);
  std::printf("rejection: %s\n", s.error_message().c_str());

  std::string result;
  v1::JobStats stats;
  s = StreamJob(stub.get(), big, 64, &result, &stats);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LE(MaxRelError(big, result), 1.2e-7);
  EXPECT_GE(stats.device_index(), 0);
  EXPECT_EQ(Reserved(stub.get()), 0);
}

TEST_F(ServerGpuTest, JobsSpreadOverEveryGpu) {
  ServerProcess server({"--backend=cuda"});
  auto stub = Connect(server.address());
  const v1::GetServerInfoResponse before = Info(stub.get());
  const int gpus = before.devices_size() - 1;
  if (gpus < 2) GTEST_SKIP() << "one GPU on this host: multi-GPU placement not exercised";
  std::vector<std::future<bool>> done;
  for (int c = 0; c < 4 * gpus; ++c) {
    done.push_back(std::async(std::launch::async, [&, c] {
      auto s = Connect(server.address());
      bool all = true;
      for (int i = 0; i < 8; ++i) {
        RandomJob job = MakeJob(2000, 2000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR,
                                v1::SIDE_LEFT, c * 100 + i);
        std::string result;
        all &= StreamJob(s.get(), job, 100, &result, nullptr).ok() &&
               MaxRelError(job, result) <= 1.2e-7;
      }
      return all;
    }));
  }
  for (auto& f : done) EXPECT_TRUE(f.get());
  const v1::GetServerInfoResponse after = Info(stub.get());
  for (int g = 1; g <= gpus; ++g) {
    std::printf("GPU %d (%s): %lld jobs completed\n", after.devices(g).index(),
                after.devices(g).name().c_str(),
                static_cast<long long>(after.devices(g).completed_jobs()));
    EXPECT_GT(after.devices(g).completed_jobs(), 0) << "GPU " << g - 1 << " got no job";
  }
}

}  // namespace
}  // namespace dgmm::testing

namespace dgmm::testing {
namespace {

// The admission scenarios of tests/integration/admission_test.cc, with the
// GPU budget as the scarce one. With 1 MiB tiles and 8 pieces in flight a
// streamed job holds 2 x 8 x 1 MiB + diagonal of device memory; a unary
// 1500x1500 float32 job holds 18 MB + diagonal. A 20 MiB GPU budget takes
// one of them at a time.
const std::vector<std::string> kTightGpu = {
    "--backend=cuda", "--cuda_tile_bytes=1MiB", "--cuda_pieces_in_flight=8",
    "--max_block_bytes=1MiB", "--gpu_memory_budget=20MiB", "--max_queue=2"};

int64_t QueuedJobs(v1::Dgmm::Stub* stub) {
  int64_t n = 0;
  const v1::GetServerInfoResponse info = Info(stub);
  for (const auto& d : info.devices()) n += d.queued_jobs();
  return n;
}

bool Eventually(const std::function<bool()>& pred) {
  for (int i = 0; i < 500; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST_F(ServerGpuTest, GpuBudgetQueuesInFifoOrderRejectsWhenFullAndHonoursDeadlines) {
  ServerProcess server(kTightGpu);
  auto stub = Connect(server.address());
  // Jobs go to the GPU with the most free budget, so hold every GPU's.
  const int gpus = Info(stub.get()).devices_size() - 1;
  auto hold_all = [&] {
    std::vector<std::unique_ptr<HeldStream>> held;
    for (int g = 0; g < gpus; ++g) {
      held.push_back(std::make_unique<HeldStream>(stub.get(), 4, 4));
      EXPECT_TRUE(held.back()->accepted());
    }
    return held;
  };
  auto holders = hold_all();
  std::vector<RandomJob> jobs;
  std::vector<std::future<std::pair<grpc::Status, v1::MultiplyResponse>>> replies;
  for (int i = 0; i < 2; ++i) {
    jobs.push_back(MakeJob(1500, 1500, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT,
                           40 + i));
  }
  for (int i = 0; i < 2; ++i) {
    replies.push_back(std::async(std::launch::async, [&, i] {
      v1::MultiplyResponse r;
      grpc::Status s = UnaryJob(stub.get(), jobs[i], &r);
      return std::make_pair(s, r);
    }));
    ASSERT_TRUE(Eventually([&] { return QueuedJobs(stub.get()) == i + 1; }));
  }
  grpc::ClientContext ctx;
  v1::MultiplyResponse r;
  grpc::Status full = UnaryJob(stub.get(), jobs[0], &r, &ctx);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.error_message();
  EXPECT_NE(ctx.GetServerTrailingMetadata().count("grpc-retry-pushback-ms"), 0u);
  for (auto& h : holders) ASSERT_TRUE(h->Finish().ok());
  uint64_t last = 0;
  for (int i = 0; i < 2; ++i) {
    auto [s, resp] = replies[i].get();
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LE(MaxRelError(jobs[i], resp.result()), 1.2e-7);
    EXPECT_GT(resp.stats().job_id(), last);
    last = resp.stats().job_id();
  }
  // A deadline that expires while queued behind the holders.
  auto again = hold_all();
  auto expired = std::async(std::launch::async, [&] {
    grpc::ClientContext short_ctx;
    short_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::MultiplyResponse r2;
    return UnaryJob(stub.get(), jobs[1], &r2, &short_ctx).error_code();
  });
  ASSERT_TRUE(Eventually([&] { return QueuedJobs(stub.get()) == 1; }));
  EXPECT_EQ(expired.get(), grpc::StatusCode::DEADLINE_EXCEEDED);
  for (auto& h : again) ASSERT_TRUE(h->Finish().ok());
  EXPECT_TRUE(Eventually([&] { return Reserved(stub.get()) == 0; }));
}

TEST_F(ServerGpuTest, CancelledGpuStreamsReturnTheirReservations) {
  ServerProcess server(kTightGpu);
  auto stub = Connect(server.address());
  RandomJob big = MakeJob(4000, 3000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 5);
  for (int round = 0; round < 10; ++round) {
    grpc::ClientContext ctx;
    auto stream = stub->MultiplyStream(&ctx);
    v1::MultiplyStreamRequest h;
    *h.mutable_header() = big.header;
    ASSERT_TRUE(stream->Write(h));
    v1::MultiplyStreamResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    const int64_t row = 3000 * 4;
    for (int64_t first = 0; first < 80 * (round + 1); first += 80) {
      v1::MultiplyStreamRequest b;
      b.mutable_block()->set_first_line(first);
      b.mutable_block()->set_data(big.matrix.substr(first * row, 80 * row));
      if (!stream->Write(b)) break;
    }
    ctx.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(Eventually([&] { return Reserved(stub.get()) == 0; }));
  std::string result;
  ASSERT_TRUE(StreamJob(stub.get(), big, 80, &result, nullptr).ok());
  EXPECT_LE(MaxRelError(big, result), 1.2e-7);
}

}  // namespace
}  // namespace dgmm::testing
