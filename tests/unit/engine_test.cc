// The engine's routing and health, with a fake GPU standing in for CUDA (CI
// has no GPU; the real devices are exercised by tests/gpu on an H200).
#include "service/engine/engine.h"

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "service/backends/cpu/cpu_device.h"
#include "service/core/host_buffers.h"
#include "service/rpc/server_info.h"

namespace dgmm {
namespace {

// A GPU whose every job fails the way a sticky CUDA error does: INTERNAL,
// and the device leaves service.
class BrokenGpu : public Device {
 public:
  int index() const override { return 0; }
  std::string name() const override { return "fake GPU"; }
  int64_t total_memory_bytes() const override { return int64_t{1} << 30; }
  int64_t free_memory_at_start_bytes() const override { return int64_t{1} << 30; }
  int streams() const override { return 1; }
  std::vector<BackendKind> backends() const override { return {BackendKind::kCudaKernel}; }
  bool in_service() const override { return in_service_; }
  int64_t Footprint(const Problem& p, JobMode mode, int64_t block) const override {
    return 2 * p.matrix_bytes();
  }
  absl::StatusOr<std::unique_ptr<JobContext>> Begin(const Problem&, BackendKind,
                                                     const std::byte*, JobMode,
                                                     int64_t) override {
    struct Job : JobContext {
      BrokenGpu* gpu;
      absl::Status Process(const Tile&, const CancelFn&, StageTimes*) override {
        gpu->in_service_ = false;
        return absl::InternalError("fake: an illegal memory access was encountered");
      }
    };
    auto job = std::make_unique<Job>();
    job->gpu = this;
    return std::unique_ptr<JobContext>(std::move(job));
  }
  HostBufferPool& block_buffers() override { return *blocks_; }
  std::atomic<bool> in_service_{true};
  std::shared_ptr<HostBufferPool> blocks_ = HostBufferPool::CreateMapped(0);
};

JobRequest Request(const std::vector<float>& diag) {
  JobRequest r;
  r.problem = Problem{2, 2, DType::kFloat32, Layout::kRowMajor, Side::kRight};
  r.diagonal = absl::string_view(reinterpret_cast<const char*>(diag.data()), 8);
  return r;
}

// An engine with a one-thread CPU device and one BrokenGpu (the default).
std::unique_ptr<Engine> EngineWithBrokenGpu() {
  std::vector<std::unique_ptr<Device>> gpus;
  gpus.push_back(std::make_unique<BrokenGpu>());
  auto engine = Engine::Create(EngineOptions{}, std::make_unique<CpuDevice>(1), std::move(gpus));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Starts `job` offering admitted_here: it does not come back, and is
// admitted on a job worker, not on this thread.
void ExpectRunsOnAWorker(Engine& engine, const JobRequest& job, JobMode mode) {
  std::unique_ptr<ActiveJob> here;
  std::promise<std::thread::id> worker;
  auto ticket = engine.Start(
      job, mode, absl::Now(), absl::InfiniteFuture(),
      [&](absl::StatusOr<std::unique_ptr<ActiveJob>> admitted) {
        EXPECT_TRUE(admitted.ok()) << admitted.status();
        worker.set_value(std::this_thread::get_id());
      },
      {}, &here);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_EQ(here, nullptr);
  EXPECT_NE(worker.get_future().get(), std::this_thread::get_id());
}

TEST(Engine, StickyDeviceErrorFailsOnlyThatJobAndTurnsHealthNotServing) {
  std::unique_ptr<Engine> engine = EngineWithBrokenGpu();
  ASSERT_NE(engine, nullptr);
  std::atomic<int> serving_changes{0};
  std::atomic<bool> last_serving{true};
  engine->set_serving_listener([&](bool s) {
    last_serving = s;
    serving_changes++;
  });
  EXPECT_TRUE(engine->serving());

  const std::vector<float> diag = {2, 3};
  std::vector<float> in = {1, 2, 3, 4}, out(4);
  std::promise<absl::Status> done;
  auto ticket = engine->Start(
      Request(diag), JobMode::kWhole, absl::Now(), absl::InfiniteFuture(),
      [&](absl::StatusOr<std::unique_ptr<ActiveJob>> job) {
        if (!job.ok()) {
          done.set_value(job.status());
          return;
        }
        Tile t{reinterpret_cast<const std::byte*>(in.data()),
               reinterpret_cast<std::byte*>(out.data()), 0, 2};
        std::unique_ptr<ActiveJob> active = std::move(*job);
        absl::Status s = active->Process(t, nullptr);
        active->End(s);
        active.reset();  // returns the reservation before the test looks
        done.set_value(s);
      });
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  absl::Status s = done.get_future().get();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(s.message()).find("illegal memory access"), std::string::npos);

  EXPECT_FALSE(engine->serving());
  EXPECT_GE(serving_changes.load(), 1);
  EXPECT_FALSE(last_serving.load());
  // No GPU left: GPU jobs are refused with UNAVAILABLE, nothing is reserved.
  auto refused = engine->Start(Request(diag), JobMode::kWhole, absl::Now(), absl::InfiniteFuture(),
                               [](auto) {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine->total_reserved(), 0);
  const v1::GetServerInfoResponse info = DescribeServer(*engine, nullptr);
  ASSERT_EQ(info.devices_size(), 2);
  EXPECT_FALSE(info.devices(1).in_service());
  EXPECT_EQ(info.devices(1).rejected_jobs().at("internal"), 1);
}

// Engine::Start's admitted_here: a small CPU job admitted at once
// comes back to the caller and `done` never runs; a job routed to a GPU,
// however small, still goes to a job worker.
TEST(Engine, OnlyASmallCpuJobAdmittedAtOnceComesBackToTheCaller) {
  std::unique_ptr<Engine> engine = EngineWithBrokenGpu();
  ASSERT_NE(engine, nullptr);
  const std::vector<float> diag = {2, 3};

  JobRequest cpu_job = Request(diag);
  cpu_job.backend = BackendKind::kCpu;
  std::unique_ptr<ActiveJob> here;
  bool done_ran = false;
  auto ticket = engine->Start(
      cpu_job, JobMode::kWhole, absl::Now(), absl::InfiniteFuture(),
      [&](absl::StatusOr<std::unique_ptr<ActiveJob>>) { done_ran = true; }, {}, &here);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_NE(here, nullptr);
  std::vector<float> in = {1, 2, 3, 4}, out(4);
  Tile t{reinterpret_cast<const std::byte*>(in.data()), reinterpret_cast<std::byte*>(out.data()),
         0, 2};
  EXPECT_TRUE(here->Process(t, nullptr).ok());
  EXPECT_EQ(out, (std::vector<float>{2, 6, 6, 12}));
  here->End(absl::OkStatus());
  here.reset();
  EXPECT_EQ(engine->total_reserved(), 0);

  // The same job on the (fake) GPU, the default here: to a worker.
  ExpectRunsOnAWorker(*engine, Request(diag), JobMode::kWhole);
  EXPECT_FALSE(done_ran);
}

// A host region job on the CPU is one tile between the client's memory: a
// small one comes back to the caller like a small whole job (the
// hop to a worker and back cost more than the job); a larger one, a
// streamed job and one on the (fake) GPU go to a worker.
TEST(Engine, ASmallCpuRegionJobComesBackToTheCallerAndLargerOnesGoToAWorker) {
  std::unique_ptr<Engine> engine = EngineWithBrokenGpu();
  ASSERT_NE(engine, nullptr);
  const std::vector<float> diag = {2, 3};
  JobRequest small = Request(diag);
  small.backend = BackendKind::kCpu;
  std::unique_ptr<ActiveJob> here;
  auto ticket = engine->Start(
      small, JobMode::kHostRegion, absl::Now(), absl::InfiniteFuture(),
      [](absl::StatusOr<std::unique_ptr<ActiveJob>>) { ADD_FAILURE() << "went to a worker"; }, {},
      &here);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_NE(here, nullptr);
  std::vector<float> in = {1.5f, -2, 3, 4.25f}, out = {-7, -7, -7, -7};
  Tile t{reinterpret_cast<const std::byte*>(in.data()), reinterpret_cast<std::byte*>(out.data()),
         0, 2};
  EXPECT_TRUE(here->Process(t, nullptr).ok());
  EXPECT_EQ(out, (std::vector<float>{3, -6, 6, 12.75f}));
  here->End(absl::OkStatus());
  here.reset();
  EXPECT_EQ(engine->total_reserved(), 0);

  // Past kRunHereMaxMatrixBytes (a 129 x 129 float32 matrix), streamed, or
  // on the GPU: to a worker.
  std::vector<float> big_diag(129, 1.0f);
  JobRequest big;
  big.problem = Problem{129, 129, DType::kFloat32, Layout::kRowMajor, Side::kRight};
  big.diagonal = absl::string_view(reinterpret_cast<const char*>(big_diag.data()),
                                   big_diag.size() * sizeof(float));
  big.backend = BackendKind::kCpu;
  ASSERT_GT(big.problem.matrix_bytes(), Engine::kRunHereMaxMatrixBytes);
  ExpectRunsOnAWorker(*engine, big, JobMode::kHostRegion);
  ExpectRunsOnAWorker(*engine, small, JobMode::kStreamed);
}

// A GPU job on a host region of at most kRunHereGpuMaxMatrixBytes comes back
// to the caller too, one at a time: while one is held, the next goes to a
// worker; once it has ended, the next comes back again. A larger one, and a
// whole (socket) GPU job, go to a worker.
TEST(Engine, OneSmallGpuRegionJobAtATimeComesBackToTheCaller) {
  // Two (fake) GPUs of one stream each, so that a second job is admitted at
  // once while the first is held.
  std::vector<std::unique_ptr<Device>> gpus;
  gpus.push_back(std::make_unique<BrokenGpu>());
  gpus.push_back(std::make_unique<BrokenGpu>());
  auto created = Engine::Create(EngineOptions{}, std::make_unique<CpuDevice>(1), std::move(gpus));
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Engine> engine = std::move(*created);
  const std::vector<float> diag = {2, 3};
  const JobRequest gpu_job = Request(diag);  // BACKEND_AUTO: the (fake) GPU
  auto start_here = [&](std::unique_ptr<ActiveJob>* here) {
    auto ticket = engine->Start(
        gpu_job, JobMode::kHostRegion, absl::Now(), absl::InfiniteFuture(),
        [](absl::StatusOr<std::unique_ptr<ActiveJob>>) { ADD_FAILURE() << "went to a worker"; }, {},
        here);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    ASSERT_NE(*here, nullptr);
    EXPECT_EQ(WireBackend(*(*here)->stats().backend), v1::BACKEND_CUDA_KERNEL);
  };
  std::unique_ptr<ActiveJob> first;
  start_here(&first);
  if (first == nullptr) return;
  ExpectRunsOnAWorker(*engine, gpu_job, JobMode::kHostRegion);  // the place is taken
  first->End(absl::OkStatus());
  first.reset();
  std::unique_ptr<ActiveJob> again;
  start_here(&again);
  if (again == nullptr) return;
  again.reset();  // abandoned: ends, and gives the place back
  std::unique_ptr<ActiveJob> third;
  start_here(&third);
  third.reset();

  std::vector<float> big_diag(2049, 1.0f);
  JobRequest big;  // 2049 x 2049 float32: past kRunHereGpuMaxMatrixBytes
  big.problem = Problem{2049, 2049, DType::kFloat32, Layout::kRowMajor, Side::kRight};
  big.diagonal = absl::string_view(reinterpret_cast<const char*>(big_diag.data()),
                                   big_diag.size() * sizeof(float));
  ASSERT_GT(big.problem.matrix_bytes(), Engine::kRunHereGpuMaxMatrixBytes);
  ExpectRunsOnAWorker(*engine, big, JobMode::kHostRegion);
  ExpectRunsOnAWorker(*engine, gpu_job, JobMode::kWhole);
}

TEST(Engine, BackendAutoWithoutGpuRunsOnTheCpuAndCudaFlagsAreRefused) {
  auto cpu_only = Engine::Create(EngineOptions{}, std::make_unique<CpuDevice>(1), {});
  ASSERT_TRUE(cpu_only.ok());
  EXPECT_EQ(DescribeServer(**cpu_only, nullptr).default_backend(), v1::BACKEND_CPU);
  EngineOptions cuda;
  cuda.backend = ServerBackend::kCuda;
  auto refused = Engine::Create(cuda, std::make_unique<CpuDevice>(1), {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(refused.status().message()).find("needs a GPU"), std::string::npos);
}

// --auto_cpu_max_bytes: on a GPU server with --backend=auto, a BACKEND_AUTO
// socket or host-region job whose matrix is at most that size runs on the
// CPU (here, on the caller's thread when admitted at once); a larger one,
// one that names a backend and a server with a pinned --backend go to the
// GPU.
TEST(Engine, SmallAutoJobsRunOnTheCpuOfAGpuServer) {
  const std::vector<float> diag = {2, 3, 5, 7};
  auto make = [](ServerBackend backend) {
    EngineOptions o;
    o.backend = backend;
    o.auto_cpu_max_bytes = 16;  // a 2x2 float32 matrix
    std::vector<std::unique_ptr<Device>> gpus;
    gpus.push_back(std::make_unique<BrokenGpu>());
    auto engine = Engine::Create(o, std::make_unique<CpuDevice>(1), std::move(gpus));
    EXPECT_TRUE(engine.ok()) << engine.status();
    return std::move(*engine);
  };
  // Where a job runs: the backend of its stats, from the caller's thread or
  // a worker's.
  auto backend_of = [&](Engine& engine, const JobRequest& job, JobMode mode) {
    std::unique_ptr<ActiveJob> here;
    std::promise<v1::Backend> posted;
    auto ticket = engine.Start(
        job, mode, absl::Now(), absl::InfiniteFuture(),
        [&](absl::StatusOr<std::unique_ptr<ActiveJob>> active) {
          EXPECT_TRUE(active.ok()) << active.status();
          posted.set_value(active.ok() ? WireBackend(*(*active)->stats().backend) : v1::BACKEND_AUTO);
        },
        {}, &here);
    EXPECT_TRUE(ticket.ok()) << ticket.status();
    if (here == nullptr) return posted.get_future().get();
    if (WireBackend(*here->stats().backend) != v1::BACKEND_CPU) {  // a (fake) GPU region job, here
      here->End(absl::OkStatus());
      return WireBackend(*here->stats().backend);
    }
    // Admitted here on the CPU: it computes, correctly.
    std::vector<float> in = {1, 2, 3, 4}, out(4, -1.0f);
    Tile t{reinterpret_cast<const std::byte*>(in.data()), reinterpret_cast<std::byte*>(out.data()),
           0, 2};
    EXPECT_TRUE(here->Process(t, nullptr).ok());
    EXPECT_EQ(out, (std::vector<float>{2, 6, 6, 12}));
    here->End(absl::OkStatus());
    return WireBackend(*here->stats().backend);
  };
  JobRequest small = Request(diag);  // 2x2 float32: 16 bytes
  JobRequest larger = small;
  larger.problem = Problem{2, 4, DType::kFloat32, Layout::kRowMajor, Side::kRight};
  larger.diagonal = absl::string_view(reinterpret_cast<const char*>(diag.data()), 16);
  JobRequest named = small;
  named.backend = BackendKind::kCudaKernel;

  std::unique_ptr<Engine> autos = make(ServerBackend::kAuto);
  EXPECT_EQ(DescribeServer(*autos, nullptr).limits().auto_cpu_max_bytes(), 16);
  EXPECT_EQ(backend_of(*autos, small, JobMode::kWhole), v1::BACKEND_CPU);
  EXPECT_EQ(backend_of(*autos, small, JobMode::kStreamed), v1::BACKEND_CPU);
  EXPECT_EQ(backend_of(*autos, larger, JobMode::kWhole), v1::BACKEND_CUDA_KERNEL);
  EXPECT_EQ(backend_of(*autos, named, JobMode::kWhole), v1::BACKEND_CUDA_KERNEL);
  EXPECT_EQ(backend_of(*autos, small, JobMode::kHostRegion), v1::BACKEND_CPU);
  EXPECT_EQ(backend_of(*autos, larger, JobMode::kHostRegion), v1::BACKEND_CUDA_KERNEL);
  EXPECT_EQ(backend_of(*autos, named, JobMode::kHostRegion), v1::BACKEND_CUDA_KERNEL);

  std::unique_ptr<Engine> pinned = make(ServerBackend::kCudaKernel);
  EXPECT_EQ(DescribeServer(*pinned, nullptr).limits().auto_cpu_max_bytes(), 0);
  EXPECT_EQ(backend_of(*pinned, small, JobMode::kWhole), v1::BACKEND_CUDA_KERNEL);

  EngineOptions cpu_options;
  cpu_options.auto_cpu_max_bytes = 16;
  auto cpu_only = Engine::Create(cpu_options, std::make_unique<CpuDevice>(1), {});
  ASSERT_TRUE(cpu_only.ok());
  EXPECT_EQ(DescribeServer(**cpu_only, nullptr).limits().auto_cpu_max_bytes(), 0);
}

}  // namespace
}  // namespace dgmm
