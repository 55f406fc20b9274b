// The GPU engine through the Device interface, on a real GPU: correctness of
// both backends over shapes, sides, layouts and dtypes, the tiled pipeline
// (pieces of one line, parts of lines, more data than the staging ring),
// in-place jobs, pinned host memory, concurrent jobs, cancellation and the
// error path. Every test skips cleanly on a machine without a GPU.
#include "service/backends/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "service/backends/cuda/cuda_devices.h"
#include "service/backends/cuda/dgmm_kernel.h"
#include "tests/gpu/gpu_test_util.h"

namespace dgmm::testing {
namespace {

using ::testing::Combine;
using ::testing::Values;

CudaOptions Options(int64_t tile_bytes, int streams = 3, int staging = 0) {
  CudaOptions o;
  o.tile_bytes = tile_bytes;
  o.streams = streams;
  o.staging_buffers = staging;
  o.measure_backend_order = false;
  return o;
}

#define GET_DEVICE_OR_SKIP(var, options)                     \
  std::string why_##var;                                     \
  cuda::CudaDevice* var = SharedDevice(options, &why_##var); \
  if (var == nullptr) GTEST_SKIP() << kNoGpuSkip << why_##var

struct JobSpec {
  BackendKind backend = BackendKind::kCudaKernel;
  JobMode mode = JobMode::kWhole;
  int64_t block_lines = 0;  // kStreamed: lines per Process call (0: all)
  bool in_place = false;
  bool reverse_blocks = false;  // feed blocks last to first
};

// Runs `p` on `device` with fresh random data and returns the largest
// relative error against the float64 reference, or the job's error.
absl::StatusOr<double> RunJob(Device* device, const Problem& p,
                              const JobSpec& spec, uint64_t seed = 1) {
  const int64_t elements = p.rows * p.cols;
  const std::vector<std::byte> a = RandomElements(p.dtype, elements, seed);
  const std::vector<std::byte> d =
      RandomElements(p.dtype, p.diag_len(), seed + 7);
  std::vector<std::byte> out =
      spec.in_place ? a : NaNElements(p.dtype, elements);
  const int64_t block_lines =
      spec.block_lines > 0 ? spec.block_lines : std::max<int64_t>(p.lines(), 1);
  auto job = device->Begin(p, spec.backend, d.data(), spec.mode,
                           block_lines * p.line_bytes());
  if (!job.ok()) return job.status();
  std::vector<Tile> tiles;
  for (int64_t first = 0; first < p.lines(); first += block_lines) {
    const int64_t n = std::min(block_lines, p.lines() - first);
    const int64_t off = first * p.line_bytes();
    tiles.push_back(Tile{.in = (spec.in_place ? out.data() : a.data()) + off,
                         .out = out.data() + off,
                         .first_line = first,
                         .lines = n});
  }
  if (spec.reverse_blocks) std::reverse(tiles.begin(), tiles.end());
  StageTimes times;
  for (const Tile& t : tiles) {
    if (auto st = (*job)->Process(t, nullptr, &times); !st.ok()) return st;
  }
  return MaxRelativeError(p, a.data(), d.data(), out.data());
}

Problem MakeProblem(int64_t rows, int64_t cols, DType t, Layout l, Side s) {
  return Problem{
      .rows = rows, .cols = cols, .dtype = t, .layout = l, .side = s};
}

// ------------------------------------------------------ correctness matrix

using MatrixParam = std::tuple<std::pair<int64_t, int64_t>, Layout, Side, DType,
                               BackendKind, JobMode, int64_t /*tile_bytes*/>;

class CorrectnessMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(CorrectnessMatrix, MatchesFloat64Reference) {
  const auto& [shape, layout, side, dtype, backend, mode, tile_bytes] =
      GetParam();
  GET_DEVICE_OR_SKIP(device, Options(tile_bytes));
  const Problem p = MakeProblem(shape.first, shape.second, dtype, layout, side);
  JobSpec spec{.backend = backend, .mode = mode};
  if (mode == JobMode::kStreamed) {
    spec.block_lines = std::max<int64_t>(1, p.lines() / 3);
    spec.reverse_blocks = true;
  }
  auto err = RunJob(device, p, spec);
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_LE(*err, Tolerance(dtype));
}

std::string MatrixName(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto& [shape, layout, side, dtype, backend, mode, tile_bytes] =
      info.param;
  return absl::StrFormat(
      "%dx%d_%s_%s_%s_%s_%s_tile%d", shape.first, shape.second,
      layout == Layout::kRowMajor ? "row" : "col",
      side == Side::kRight ? "right" : "left",
      dtype == DType::kFloat32 ? "f32" : "f64",
      backend == BackendKind::kCublas ? "cublas" : "kernel",
      mode == JobMode::kWhole ? "whole" : "streamed", tile_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CorrectnessMatrix,
    Combine(Values(std::pair<int64_t, int64_t>{1, 1},
                   std::pair<int64_t, int64_t>{1, 1000},
                   std::pair<int64_t, int64_t>{1000, 1},
                   std::pair<int64_t, int64_t>{3, 5},
                   std::pair<int64_t, int64_t>{129, 67},
                   std::pair<int64_t, int64_t>{256, 1024},
                   std::pair<int64_t, int64_t>{1000, 3}),
            Values(Layout::kRowMajor, Layout::kColMajor),
            Values(Side::kRight, Side::kLeft),
            Values(DType::kFloat32, DType::kFloat64),
            Values(BackendKind::kCudaKernel, BackendKind::kCublas),
            Values(JobMode::kWhole, JobMode::kStreamed),
            // 64 bytes: pieces of one short line or parts of a long one.
            Values(int64_t{64}, int64_t{1} << 20)),
    MatrixName);

// ---------------------------------------------------------------- pipeline

class Pipeline : public ::testing::TestWithParam<BackendKind> {};

TEST_P(Pipeline, RowsNotAMultipleOfThePiece) {
  const Problem p =
      MakeProblem(1001, 257, DType::kFloat32, Layout::kRowMajor, Side::kRight);
  GET_DEVICE_OR_SKIP(device, Options(3 * p.line_bytes() + 4));
  for (JobMode mode : {JobMode::kWhole, JobMode::kStreamed}) {
    auto err = RunJob(
        device, p, {.backend = GetParam(), .mode = mode, .block_lines = 100});
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_LE(*err, Tolerance(p.dtype));
  }
}

TEST_P(Pipeline, PiecesOfExactlyOneLine) {
  const Problem p =
      MakeProblem(40, 96, DType::kFloat64, Layout::kColMajor, Side::kLeft);
  GET_DEVICE_OR_SKIP(device, Options(p.line_bytes()));
  for (JobMode mode : {JobMode::kWhole, JobMode::kStreamed}) {
    auto err = RunJob(device, p,
                      {.backend = GetParam(), .mode = mode, .block_lines = 7});
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_LE(*err, Tolerance(p.dtype));
  }
}

TEST_P(Pipeline, LineLongerThanAPieceIsCutIntoParts) {
  // Odd line length: the parts are not all 16-byte multiples either.
  for (Side side : {Side::kRight, Side::kLeft}) {
    const Problem p =
        MakeProblem(3, 10007, DType::kFloat64, Layout::kRowMajor, side);
    GET_DEVICE_OR_SKIP(device, Options(1000));
    for (JobMode mode : {JobMode::kWhole, JobMode::kStreamed}) {
      auto err = RunJob(
          device, p, {.backend = GetParam(), .mode = mode, .block_lines = 1});
      ASSERT_TRUE(err.ok()) << err.status();
      EXPECT_LE(*err, Tolerance(p.dtype));
    }
  }
}

TEST_P(Pipeline, MatrixLargerThanTheWholeStagingRing) {
  const Problem p =
      MakeProblem(4096, 1024, DType::kFloat32, Layout::kRowMajor, Side::kLeft);
  const CudaOptions o = Options(256 << 10);
  GET_DEVICE_OR_SKIP(device, o);
  ASSERT_GT(p.matrix_bytes(),
            int64_t{device->staging_buffers()} * o.tile_bytes);
  for (JobMode mode : {JobMode::kWhole, JobMode::kStreamed}) {
    auto err = RunJob(
        device, p, {.backend = GetParam(), .mode = mode, .block_lines = 1000});
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_LE(*err, Tolerance(p.dtype));
  }
}

TEST_P(Pipeline, InPlaceHostBuffer) {
  GET_DEVICE_OR_SKIP(device, Options(4096));
  for (Side side : {Side::kRight, Side::kLeft}) {
    const Problem p =
        MakeProblem(300, 130, DType::kFloat32, Layout::kColMajor, side);
    for (JobMode mode : {JobMode::kWhole, JobMode::kStreamed}) {
      auto err = RunJob(device, p,
                        {.backend = GetParam(),
                         .mode = mode,
                         .block_lines = 50,
                         .in_place = true});
      ASSERT_TRUE(err.ok()) << err.status();
      EXPECT_LE(*err, Tolerance(p.dtype));
    }
  }
}

TEST_P(Pipeline, StreamedJobHoldsNoMoreThanItsFootprint) {
  const Problem p =
      MakeProblem(2000, 1000, DType::kFloat32, Layout::kRowMajor, Side::kRight);
  GET_DEVICE_OR_SKIP(device, Options(64 << 10));
  const int64_t block_bytes = 100 * p.line_bytes();
  ASSERT_TRUE(device->ResetPoolHighWater().ok());
  auto err = RunJob(
      device, p,
      {.backend = GetParam(), .mode = JobMode::kStreamed, .block_lines = 100});
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_LE(*err, Tolerance(p.dtype));
  auto high = device->PoolHighWaterBytes();
  ASSERT_TRUE(high.ok()) << high.status();
  // The pool may round each of the job's three allocations up a little.
  EXPECT_LE(*high,
            device->Footprint(p, JobMode::kStreamed, block_bytes) + (64 << 10));
  EXPECT_LT(*high, p.matrix_bytes());
}

TEST_P(Pipeline, PinnedHostMemoryIsUsedDirectly) {
  const Problem p =
      MakeProblem(777, 333, DType::kFloat64, Layout::kRowMajor, Side::kLeft);
  GET_DEVICE_OR_SKIP(device, Options(64 << 10));
  const int64_t n = p.rows * p.cols;
  const auto a = RandomElements(p.dtype, n, 11);
  const auto d = RandomElements(p.dtype, p.diag_len(), 12);
  const auto nan = NaNElements(p.dtype, n);
  std::byte *pin_in = nullptr, *pin_out = nullptr;
  ASSERT_EQ(
      cudaHostAlloc(reinterpret_cast<void**>(&pin_in), p.matrix_bytes(), 0),
      cudaSuccess);
  ASSERT_EQ(
      cudaHostAlloc(reinterpret_cast<void**>(&pin_out), p.matrix_bytes(), 0),
      cudaSuccess);
  std::vector<std::byte> pageable_out(nan);
  std::memcpy(pin_in, a.data(), a.size());
  // Pinned in and out; then pinned in, pageable out.
  for (std::byte* out : {pin_out, pageable_out.data()}) {
    std::memcpy(out, nan.data(), nan.size());
    auto job = device->Begin(p, GetParam(), d.data(), JobMode::kWhole,
                             p.matrix_bytes());
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(
        (*job)
            ->Process(Tile{.in = pin_in, .out = out, .lines = p.lines()},
                      nullptr, nullptr)
            .ok());
    EXPECT_LE(MaxRelativeError(p, a.data(), d.data(), out), Tolerance(p.dtype));
  }
  cudaFreeHost(pin_in);
  cudaFreeHost(pin_out);
}

INSTANTIATE_TEST_SUITE_P(Backends, Pipeline,
                         Values(BackendKind::kCudaKernel, BackendKind::kCublas),
                         [](const auto& info) {
                           return std::string(info.param == BackendKind::kCublas
                                                  ? "cublas"
                                                  : "kernel");
                         });

// ------------------------------------------------------- launch policies

template <typename T>
void CheckEveryPolicy(cuda::CudaDevice* device, bool per_line) {
  const DType t = sizeof(T) == 4 ? DType::kFloat32 : DType::kFloat64;
  constexpr int64_t kLines = 123, kLineLen = 1024;
  const int64_t n = kLines * kLineLen;
  const int64_t diag_len = per_line ? kLines : kLineLen;
  const auto a = RandomElements(t, n, 21);
  const auto d = RandomElements(t, diag_len, 22);
  T *d_in = nullptr, *d_out = nullptr, *d_diag = nullptr;
  ASSERT_EQ(cudaMalloc(&d_in, n * sizeof(T)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, n * sizeof(T)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_diag, diag_len * sizeof(T)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_in, a.data(), a.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_diag, d.data(), d.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  const cuda::DeviceTile<T> tile{.in = d_in,
                                 .out = d_out,
                                 .diag = d_diag,
                                 .lines = kLines,
                                 .line_len = kLineLen,
                                 .per_line = per_line};
  // As a problem: row-major, lines are rows; per-line scaling is side LEFT.
  const Problem p = MakeProblem(kLines, kLineLen, t, Layout::kRowMajor,
                                per_line ? Side::kLeft : Side::kRight);
  for (int vec : {1, static_cast<int>(16 / sizeof(T))}) {
    for (int items : {1, 2, 4}) {
      for (int grid : {1, 7, 1000}) {
        const cuda::LaunchPolicy policy{.block_threads = 256,
                                        .grid_blocks = grid,
                                        .vector_width = vec,
                                        .items_per_thread = items};
        ASSERT_EQ(cudaMemset(d_out, 0xff, n * sizeof(T)), cudaSuccess);  // NaN
        ASSERT_EQ(cuda::LaunchDgmmKernel(tile, policy, nullptr), cudaSuccess);
        std::vector<std::byte> out(a.size());
        ASSERT_EQ(
            cudaMemcpy(out.data(), d_out, out.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
        EXPECT_LE(MaxRelativeError(p, a.data(), d.data(), out.data()),
                  Tolerance(t))
            << "vec " << vec << " items " << items << " grid " << grid;
      }
    }
  }
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_diag);
}

TEST(LaunchPolicy, EveryPolicyComputesTheSameResult) {
  GET_DEVICE_OR_SKIP(device, Options(1 << 20));
  for (bool per_line : {true, false}) {
    CheckEveryPolicy<float>(device, per_line);
    CheckEveryPolicy<double>(device, per_line);
  }
}

// ------------------------------------------------------------ concurrency

TEST(CudaDevice, ConcurrentJobsOnOneDevice) {
  // Two staging buffers for eight jobs of three streams: jobs wait for the
  // ring and share streams, and every result must still be exact.
  GET_DEVICE_OR_SKIP(device, Options(32 << 10, 3, 2));
  constexpr int kJobs = 8;
  std::vector<absl::StatusOr<double>> errors(kJobs, 0.0);
  std::vector<Problem> problems;
  std::vector<std::thread> threads;
  for (int i = 0; i < kJobs; ++i) {
    problems.push_back(MakeProblem(
        500 + 37 * i, 300 + 11 * i, i % 2 ? DType::kFloat64 : DType::kFloat32,
        i % 3 ? Layout::kRowMajor : Layout::kColMajor,
        i % 4 < 2 ? Side::kRight : Side::kLeft));
  }
  for (int i = 0; i < kJobs; ++i) {
    threads.emplace_back([&, i] {
      const JobSpec spec{
          .backend = i % 2 ? BackendKind::kCublas : BackendKind::kCudaKernel,
          .mode = i % 3 ? JobMode::kStreamed : JobMode::kWhole,
          .block_lines = 64};
      for (int rep = 0; rep < 3 && errors[i].ok(); ++rep) {
        errors[i] = RunJob(device, problems[i], spec, 100 + i * 10 + rep);
        if (errors[i].ok() && *errors[i] > Tolerance(problems[i].dtype)) break;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(errors[i].ok()) << "job " << i << ": " << errors[i].status();
    EXPECT_LE(*errors[i], Tolerance(problems[i].dtype)) << "job " << i;
  }
}

// ------------------------------------------------- cancellation and errors

TEST(CudaDevice, CancelledBetweenPiecesEndsTheJobWithCancelled) {
  const Problem p =
      MakeProblem(1000, 1000, DType::kFloat32, Layout::kRowMajor, Side::kRight);
  GET_DEVICE_OR_SKIP(device, Options(64 << 10));
  const auto a = RandomElements(p.dtype, p.rows * p.cols, 3);
  const auto d = RandomElements(p.dtype, p.diag_len(), 4);
  std::vector<std::byte> out(a.size());
  auto job = device->Begin(p, BackendKind::kCudaKernel, d.data(),
                           JobMode::kWhole, p.matrix_bytes());
  ASSERT_TRUE(job.ok()) << job.status();
  int polls = 0;
  const absl::Status st = (*job)->Process(
      Tile{.in = a.data(), .out = out.data(), .lines = p.lines()},
      [&] { return ++polls > 3; }, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_EQ(polls, 4);
  EXPECT_TRUE(device->in_service());
  auto again = RunJob(device, p, {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_LE(*again, Tolerance(p.dtype));
}

TEST(CudaDevice, DeviceOutOfMemoryIsInternalAndLeavesTheDeviceInService) {
  GET_DEVICE_OR_SKIP(device, Options(1 << 20));
  // 2 × 160 GB: more than any GPU of this generation holds.
  const Problem huge = MakeProblem(200000, 200000, DType::kFloat32,
                                   Layout::kRowMajor, Side::kRight);
  const auto d = RandomElements(huge.dtype, huge.diag_len(), 5);
  auto job = device->Begin(huge, BackendKind::kCudaKernel, d.data(),
                           JobMode::kWhole, huge.matrix_bytes());
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInternal) << job.status();
  EXPECT_NE(job.status().message().find("out of memory"), std::string::npos)
      << job.status();
  EXPECT_TRUE(device->in_service());
  const Problem small =
      MakeProblem(100, 100, DType::kFloat32, Layout::kRowMajor, Side::kLeft);
  auto err = RunJob(device, small, {});
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_LE(*err, Tolerance(small.dtype));
}

TEST(CudaDevice, BeginRejectsTheCpuBackend) {
  GET_DEVICE_OR_SKIP(device, Options(1 << 20));
  const Problem p =
      MakeProblem(2, 2, DType::kFloat32, Layout::kRowMajor, Side::kLeft);
  const auto d = RandomElements(p.dtype, 2, 1);
  auto job = device->Begin(p, BackendKind::kCpu, d.data(), JobMode::kWhole, 16);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaDevice, ProcessRejectsATileOutsideTheMatrix) {
  GET_DEVICE_OR_SKIP(device, Options(1 << 20));
  const Problem p =
      MakeProblem(4, 4, DType::kFloat32, Layout::kRowMajor, Side::kLeft);
  const auto a = RandomElements(p.dtype, 16, 1);
  std::vector<std::byte> out(a.size());
  auto job = device->Begin(p, BackendKind::kCudaKernel, a.data(),
                           JobMode::kWhole, p.matrix_bytes());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*job)
                ->Process(Tile{.in = a.data(),
                               .out = out.data(),
                               .first_line = 2,
                               .lines = 3},
                          nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------- footprint, identity

TEST(CudaDevice, StreamedFootprintDoesNotGrowWithLines) {
  GET_DEVICE_OR_SKIP(device, Options(8 << 20));
  Problem p =
      MakeProblem(10, 4096, DType::kFloat32, Layout::kRowMajor, Side::kRight);
  const int64_t block = 64 * p.line_bytes();
  const int64_t small = device->Footprint(p, JobMode::kStreamed, block);
  p.rows = 1000000;
  EXPECT_EQ(device->Footprint(p, JobMode::kStreamed, block), small);
  EXPECT_EQ(device->Footprint(p, JobMode::kWhole, p.matrix_bytes()),
            2 * p.matrix_bytes() + p.diag_bytes());
}

TEST(CudaDevice, DescribesItself) {
  CudaOptions o = Options(1 << 20);
  o.measure_backend_order = true;
  GET_DEVICE_OR_SKIP(device, o);
  EXPECT_GE(device->index(), 0);
  EXPECT_FALSE(device->name().empty());
  EXPECT_GT(device->total_memory_bytes(), 0);
  EXPECT_GT(device->free_memory_at_start_bytes(), 0);
  EXPECT_EQ(device->streams(), 3);
  const auto b = device->backends();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NE(b[0], b[1]);
  for (BackendKind k : b) {
    EXPECT_TRUE(k == BackendKind::kCudaKernel || k == BackendKind::kCublas);
  }
  EXPECT_TRUE(device->in_service());
  std::printf("device %d: %s, %lld SMs, backends first=%s\n", device->index(),
              device->name().c_str(),
              static_cast<long long>(device->multiprocessors()),
              b[0] == BackendKind::kCublas ? "cublas" : "cuda-kernel");
}

}  // namespace
}  // namespace dgmm::testing
