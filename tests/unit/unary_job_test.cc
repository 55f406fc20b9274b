// UnaryJob (service/job/unary_job.h) on a real engine with the CPU device,
// with fakes for gRPC's request and call: a small job that admission admits
// at once runs on the thread that handed in the request (gRPC's callback
// thread in the server), and computes the right result; a larger
// job, or a small one that has to wait for room, runs on a job worker. No
// timing: each test waits for the reply itself.
#include "service/job/unary_job.h"

#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "service/backends/cpu/cpu_device.h"
#include "service/rpc/server_info.h"

namespace dgmm {
namespace {

// The request message: a header and the matrix's bytes.
class FakeRequest final : public UnaryRequest {
 public:
  FakeRequest(v1::JobHeader header, std::vector<std::byte> matrix)
      : header_(std::move(header)), matrix_(std::move(matrix)) {}
  int64_t size() const override {
    return static_cast<int64_t>(header_.ByteSizeLong() + matrix_.size() + 16);
  }
  absl::Status Peek(const v1::JobHeader** header, int64_t* matrix_bytes) override {
    *header = &header_;
    *matrix_bytes = static_cast<int64_t>(matrix_.size());
    return absl::OkStatus();
  }
  absl::Status CopyMatrix(std::byte* dst, int64_t bytes) override {
    if (bytes != static_cast<int64_t>(matrix_.size())) return absl::InternalError("size");
    std::memcpy(dst, matrix_.data(), matrix_.size());
    return absl::OkStatus();
  }

 private:
  v1::JobHeader header_;
  std::vector<std::byte> matrix_;
};

// The call: what the job replied, and on which thread.
struct Replied {
  absl::Status status;
  std::vector<std::byte> result;
  std::thread::id thread;
};

class FakeIo final : public UnaryIo {
 public:
  void StartRead() override { reads++; }
  void Reply(HostBuffer result, size_t bytes, const JobStats&) override {
    Replied r;
    r.result.assign(result.data(), result.data() + bytes);
    r.thread = std::this_thread::get_id();
    done.set_value(std::move(r));
  }
  void Fail(const absl::Status& status) override {
    Replied r;
    r.status = status;
    r.thread = std::this_thread::get_id();
    done.set_value(std::move(r));
  }
  void CancelCall() override {}

  int reads = 0;
  std::promise<Replied> done;
};

struct Shape {
  int64_t rows, cols;
  v1::DType dtype;
  v1::Layout layout;
  v1::Side side;
};

class UnaryJobTest : public ::testing::Test {
 protected:
  explicit UnaryJobTest(int64_t host_budget = int64_t{64} << 20) {
    EngineOptions o;
    o.host_memory_budget = Budget::Bytes(host_budget);
    auto e = Engine::Create(o, std::make_unique<CpuDevice>(2), {});
    EXPECT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    intake_ = std::make_unique<Intake>(engine_.get(), nullptr);
  }

  std::shared_ptr<JobSession> NewSession() {
    return std::make_shared<JobSession>(
        engine_.get(), CallInfo{.client = "test", .connection = "test:1", .token = "",
                                .arrived = absl::Now(),
                                .deadline = absl::Now() + absl::Seconds(60)});
  }

  // Fresh random A and d of `s` (values in [-2, 2), never 0), the request,
  // and C = A·diag(d) or diag(d)·A computed in float64.
  std::unique_ptr<FakeRequest> MakeRequest(const Shape& s, std::vector<double>* expected) {
    const bool f64 = s.dtype == v1::DTYPE_FLOAT64;
    const size_t elem = f64 ? 8 : 4;
    const int64_t n = s.rows * s.cols;
    const int64_t diag_len = s.side == v1::SIDE_RIGHT ? s.cols : s.rows;
    std::uniform_real_distribution<double> dist(0.25, 2.0);
    std::bernoulli_distribution negative(0.5);
    const auto draw = [&] { return negative(rng_) ? -dist(rng_) : dist(rng_); };
    std::vector<double> a(static_cast<size_t>(n)), d(static_cast<size_t>(diag_len));
    for (double& x : a) x = draw();
    for (double& x : d) x = draw();
    if (!f64) {  // what float32 holds, so that the reference sees the same inputs
      for (double& x : a) x = static_cast<float>(x);
      for (double& x : d) x = static_cast<float>(x);
    }
    expected->resize(a.size());
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < s.cols; ++c) {
        const int64_t i = s.layout == v1::LAYOUT_ROW_MAJOR ? r * s.cols + c : c * s.rows + r;
        (*expected)[static_cast<size_t>(i)] =
            a[static_cast<size_t>(i)] * d[static_cast<size_t>(s.side == v1::SIDE_RIGHT ? c : r)];
      }
    }
    const auto encode = [&](const std::vector<double>& v) {
      std::vector<std::byte> out(v.size() * elem);
      for (size_t i = 0; i < v.size(); ++i) {
        if (f64) {
          std::memcpy(out.data() + i * 8, &v[i], 8);
        } else {
          const float f = static_cast<float>(v[i]);
          std::memcpy(out.data() + i * 4, &f, 4);
        }
      }
      return out;
    };
    v1::JobHeader h;
    h.set_rows(s.rows);
    h.set_cols(s.cols);
    h.set_dtype(s.dtype);
    h.set_layout(s.layout);
    h.set_side(s.side);
    h.set_backend(v1::BACKEND_CPU);
    const std::vector<std::byte> diag = encode(d);
    h.set_diagonal(std::string(reinterpret_cast<const char*>(diag.data()), diag.size()));
    return std::make_unique<FakeRequest>(std::move(h), encode(a));
  }

  // Fills buffers of the CPU pool that a job of `bytes` would take with NaN
  // and gives them back, so that a job's result buffer starts poisoned: a
  // result that is not written shows.
  void PoisonPool(int64_t bytes) {
    std::vector<HostBuffer> held;
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<HostBuffer> b = engine_->host_block_buffers().Take(bytes);
      ASSERT_TRUE(b.ok()) << b.status();
      std::memset(b->data(), 0xff, static_cast<size_t>(b->capacity()));  // NaN in f32 and f64
      held.push_back(std::move(*b));
    }
  }

  static void ExpectMatches(const Shape& s, const Replied& r, const std::vector<double>& expected) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    const bool f64 = s.dtype == v1::DTYPE_FLOAT64;
    ASSERT_EQ(r.result.size(), expected.size() * (f64 ? 8 : 4));
    for (size_t i = 0; i < expected.size(); ++i) {
      double got;
      if (f64) {
        std::memcpy(&got, r.result.data() + i * 8, 8);
      } else {
        float f;
        std::memcpy(&f, r.result.data() + i * 4, 4);
        got = f;
      }
      // One rounding of the product in the element type.
      const double tolerance = std::abs(expected[i]) * (f64 ? 1e-15 : 1e-7);
      ASSERT_NEAR(got, expected[i], tolerance)
          << "element " << i << " of " << s.rows << "x" << s.cols;
    }
  }

  // Runs one job to its reply: begins it, hands in the request on this
  // thread and waits. `*returned_first`: whether the reply came before
  // OnRequest returned (it ran on this thread).
  Replied RunJob(std::unique_ptr<FakeRequest> request, bool* replied_inside = nullptr) {
    FakeIo io;
    std::future<Replied> done = io.done.get_future();
    auto job = std::make_shared<UnaryJob>(NewSession(), intake_.get(), &gate_, StreamTimeouts{},
                                          &io);
    job->Begin();
    EXPECT_EQ(io.reads, 1);
    job->OnRequest(std::move(request), false);
    if (replied_inside != nullptr) {
      *replied_inside = done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    }
    Replied r = done.get();
    job->Detach();
    return r;
  }

  std::mt19937_64 rng_{20261202};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Intake> intake_;
  ReceiveGate gate_{int64_t{256} << 20, 64};
};

TEST_F(UnaryJobTest, ASmallJobRunsOnTheCallingThreadAndComputesTheRightResult) {
  const std::vector<Shape> shapes = {
      {1, 1, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT},
      {1, 1, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT},
      {3, 5, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT},
      {7, 13, v1::DTYPE_FLOAT32, v1::LAYOUT_COL_MAJOR, v1::SIDE_RIGHT},
      {100, 100, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT},
      {33, 97, v1::DTYPE_FLOAT64, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT},
      // Exactly Engine::kRunHereMaxMatrixBytes (64 KiB).
      {128, 128, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT},
  };
  ASSERT_EQ(128 * 128 * 4, Engine::kRunHereMaxMatrixBytes);
  for (const Shape& s : shapes) {
    std::vector<double> expected;
    auto request = MakeRequest(s, &expected);
    PoisonPool(static_cast<int64_t>(expected.size()) * (s.dtype == v1::DTYPE_FLOAT64 ? 8 : 4));
    bool replied_inside = false;
    const Replied r = RunJob(std::move(request), &replied_inside);
    EXPECT_TRUE(replied_inside) << s.rows << "x" << s.cols;
    EXPECT_EQ(r.thread, std::this_thread::get_id()) << s.rows << "x" << s.cols;
    ExpectMatches(s, r, expected);
  }
  // Each ended once, counted, and gave its reservation back.
  EXPECT_EQ(DescribeServer(*engine_, nullptr).devices(0).completed_jobs(), static_cast<int64_t>(shapes.size()));
  EXPECT_EQ(engine_->total_reserved(), 0);
}

TEST_F(UnaryJobTest, AJobOverTheBoundRunsOnAWorker) {
  const std::vector<Shape> shapes = {
      // One element over 64 KiB, a float64 100x100, and one of several grains.
      {1, 16385, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT},
      {100, 100, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT},
      {300, 500, v1::DTYPE_FLOAT32, v1::LAYOUT_COL_MAJOR, v1::SIDE_RIGHT},
  };
  for (const Shape& s : shapes) {
    std::vector<double> expected;
    auto request = MakeRequest(s, &expected);
    PoisonPool(static_cast<int64_t>(expected.size()) * (s.dtype == v1::DTYPE_FLOAT64 ? 8 : 4));
    const Replied r = RunJob(std::move(request));
    EXPECT_NE(r.thread, std::this_thread::get_id()) << s.rows << "x" << s.cols;
    ExpectMatches(s, r, expected);
  }
  EXPECT_EQ(engine_->total_reserved(), 0);
}

// A read of a message whose size is not known yet is charged at least a
// quarter of the gate, whatever the unary limit (16 MiB here, a gate of
// 256 MiB): at most four such reads at once, since gRPC takes in a message
// whole before its size can be checked. The others wait, reading nothing,
// and go on as the reads in flight end.
TEST_F(UnaryJobTest, AtMostFourReadsOfUnknownSizeRunAtOnce) {
  ASSERT_LT(engine_->options().limits.max_unary_message_bytes, gate_.capacity() / 4);
  EXPECT_EQ(gate_.UnsizedCharge(engine_->options().limits.max_unary_message_bytes),
            gate_.capacity() / 4);
  std::vector<std::unique_ptr<FakeIo>> ios;
  std::vector<std::shared_ptr<UnaryJob>> jobs;
  for (int i = 0; i < 6; ++i) {
    ios.push_back(std::make_unique<FakeIo>());
    jobs.push_back(std::make_shared<UnaryJob>(NewSession(), intake_.get(), &gate_,
                                              StreamTimeouts{}, ios.back().get()));
    jobs.back()->Begin();
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(ios[i]->reads, i < 4 ? 1 : 0) << i;
  EXPECT_EQ(gate_.held(), gate_.capacity());
  EXPECT_EQ(gate_.waiting(), 2);
  // The first read ends (a small job): its charge goes, and the fifth reads.
  const Shape s{10, 10, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT};
  std::vector<double> expected;
  jobs[0]->OnRequest(MakeRequest(s, &expected), false);
  Replied r = ios[0]->done.get_future().get();
  ExpectMatches(s, r, expected);
  EXPECT_EQ(ios[4]->reads, 1);
  EXPECT_EQ(ios[5]->reads, 0);
  for (int i = 1; i < 5; ++i) {
    jobs[i]->OnRequest(MakeRequest(s, &expected), false);
    r = ios[i]->done.get_future().get();
    ExpectMatches(s, r, expected);
  }
  EXPECT_EQ(ios[5]->reads, 1);
  jobs[5]->OnRequest(MakeRequest(s, &expected), false);
  r = ios[5]->done.get_future().get();
  ExpectMatches(s, r, expected);
  for (auto& job : jobs) job->Detach();
  EXPECT_EQ(gate_.held(), 0);
  EXPECT_EQ(engine_->total_reserved(), 0);
}

// A budget that one 100x100 float32 job (2 x 40000 + 400 bytes) fills.
class UnaryJobQueuedTest : public UnaryJobTest {
 protected:
  UnaryJobQueuedTest() : UnaryJobTest(80400) {}
};

TEST_F(UnaryJobQueuedTest, ASmallJobThatWaitsForRoomRunsOnAWorkerNotOnTheThreadThatFreedIt) {
  // Hold the budget with an admitted job of another session.
  std::vector<float> diag(100, 2.0f);
  JobRequest big;
  big.problem = Problem{100, 100, DType::kFloat32, Layout::kRowMajor, Side::kRight};
  big.diagonal = absl::string_view(reinterpret_cast<const char*>(diag.data()), 400);
  std::promise<absl::StatusOr<std::shared_ptr<ComputeStage>>> holder;
  ASSERT_TRUE(NewSession()
                  ->Start(big, JobMode::kWhole,
                          [&](absl::StatusOr<std::shared_ptr<ComputeStage>> a) {
                            holder.set_value(std::move(a));
                          })
                  .ok());
  absl::StatusOr<std::shared_ptr<ComputeStage>> held = holder.get_future().get();
  ASSERT_TRUE(held.ok()) << held.status();

  // A 1x1 job now waits in the queue: it does not run inside OnRequest.
  const Shape s{1, 1, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT};
  std::vector<double> expected;
  FakeIo io;
  std::future<Replied> done = io.done.get_future();
  auto job = std::make_shared<UnaryJob>(NewSession(), intake_.get(), &gate_, StreamTimeouts{},
                                        &io);
  job->Begin();
  job->OnRequest(MakeRequest(s, &expected), false);
  EXPECT_EQ(done.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  EXPECT_EQ(DescribeServer(*engine_, nullptr).devices(0).queued_jobs(), 1);

  // Freeing the room on this thread admits it; it runs on a worker.
  (*held)->End(absl::OkStatus(), 0, 0);
  held->reset();
  const Replied r = done.get();
  EXPECT_NE(r.thread, std::this_thread::get_id());
  ExpectMatches(s, r, expected);
  job->Detach();
}

}  // namespace
}  // namespace dgmm
