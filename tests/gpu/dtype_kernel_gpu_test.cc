// The CUDA kernel layer for every element type on a real GPU:
// LaunchScaleKernel for every supported (A, C) pair, layout and side (left,
// right, both), on the vector and the scalar path and through the
// grid-stride loop, element by element and bit for bit (any NaN equals any
// NaN) against the same reference the CPU backend matches
// (tests/support/dtype_reference.h); and cublasCdgmm/Zdgmm through
// LaunchCublasDgmm. Self-contained: no server, no CudaDevice. Skips without
// a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <complex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/backends/cuda/dgmm_kernel.h"
#include "tests/support/dtype_reference.h"

namespace dgmm {
namespace {

constexpr char kNoGpuSkip[] = "dgmm-gpu-skip: no CUDA device: ";

int Multiprocessors(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    *why = err != cudaSuccess ? cudaGetErrorString(err) : "no devices";
    return 0;
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return sms;
}

#define SMS_OR_SKIP(var)                                        \
  std::string why_##var;                                        \
  const int var = Multiprocessors(&why_##var);                  \
  if (var == 0) GTEST_SKIP() << kNoGpuSkip << why_##var

template <typename T>
T* Upload(const T* host, int64_t n) {
  if (host == nullptr) return nullptr;
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host, n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(p);
}

// How the tile is launched: the chosen policy, or the chosen shape on 3
// blocks (every thread loops), or forced scalar.
enum class Launch { kChosen, kGridStride, kScalar };

template <typename TA, typename TC>
void RunOnGpu(const ref::TileArgs<TA, TC>& t, int sms, Launch launch, bool in_place,
              cuda::LaunchPolicy* used) {
  using K = Compute<TC>;
  const int64_t n = t.lines * t.line_len;
  const int64_t left_len = t.left_per_line ? t.lines : t.line_len;
  const int64_t right_len = t.left_per_line ? t.line_len : t.lines;
  TA* in = Upload(t.in, n);
  TC* out = in_place ? reinterpret_cast<TC*>(in) : Upload<TC>(t.out, n);
  K* left = Upload(t.left, left_len);
  K* right = Upload(t.right, right_len);
  // Two tiles, the second starting mid-matrix: per-line diagonals are
  // offset by the tile's first line.
  const int64_t split = t.lines / 2;
  for (int part = 0; part < 2; ++part) {
    const int64_t first = part == 0 ? 0 : split;
    const int64_t lines = part == 0 ? split : t.lines - split;
    cuda::ScaleTile<TA, TC> tile{.in = in + first * t.line_len,
                                 .out = out + first * t.line_len,
                                 .left = left == nullptr ? nullptr
                                         : t.left_per_line ? left + first
                                                           : left,
                                 .right = right == nullptr ? nullptr
                                          : t.left_per_line ? right
                                                            : right + first,
                                 .left_per_line = t.left_per_line,
                                 .lines = lines,
                                 .line_len = t.line_len};
    cuda::LaunchPolicy policy = cuda::ChooseScalePolicy(tile, sms);
    if (part == 0) *used = policy;
    if (launch == Launch::kGridStride) policy.grid_blocks = 3;
    if (launch == Launch::kScalar) {
      policy.vector_width = 1;
      policy.items_per_thread = 4;
    }
    ASSERT_EQ(cuda::LaunchScaleKernel(tile, policy, nullptr), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(t.out, out, n * sizeof(TC), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(in);
  if (!in_place) cudaFree(out);
  cudaFree(left);
  cudaFree(right);
}

template <typename P>
class ScaleKernelGpuTest : public ::testing::Test {};

TYPED_TEST_SUITE(ScaleKernelGpuTest, ref::AllPairs);

TYPED_TEST(ScaleKernelGpuTest, EveryLayoutSideAndPathBitExactAgainstReference) {
  using TA = typename TypeParam::TA;
  using TC = typename TypeParam::TC;
  SMS_OR_SKIP(sms);
  constexpr int kFull = 16 / static_cast<int>(sizeof(TA) > sizeof(TC) ? sizeof(TA) : sizeof(TC));
  // Two full vectors per thread for a C wider than A (the second may lie
  // past the tile's end); scalars four.
  constexpr int kItems = sizeof(TC) > sizeof(TA) ? 2 : 1;
  uint64_t seed = 100;
  // 13 x 29: no vector path; 24 x 64: whole vectors in both layouts.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{13, 29}, {24, 64}}) {
    const bool vectorizable = rows % kFull == 0 && cols % kFull == 0;
    for (bool row_major : {true, false}) {
      for (ref::Sides sides : {ref::Sides::kLeft, ref::Sides::kRight, ref::Sides::kBoth}) {
        for (Launch launch : {Launch::kChosen, Launch::kGridStride, Launch::kScalar}) {
          for (bool in_place : {false, true}) {
            if (in_place && (!std::is_same_v<TA, TC> || launch != Launch::kChosen)) continue;
            const ref::UserCase c{rows, cols, row_major, sides};
            cuda::LaunchPolicy used;
            const std::string failures = ref::CheckCase<TA, TC>(
                c, ++seed, in_place,
                [&](const ref::TileArgs<TA, TC>& t) { RunOnGpu(t, sms, launch, in_place, &used); });
            EXPECT_EQ(failures, "") << ref::CaseName(c) << " launch " << static_cast<int>(launch)
                                    << (in_place ? " in place" : "");
            EXPECT_EQ(used.vector_width, vectorizable ? kFull : 1) << ref::CaseName(c);
            EXPECT_EQ(used.items_per_thread, vectorizable ? kItems : 4) << ref::CaseName(c);
          }
        }
      }
    }
  }
}

TEST(ScaleKernelGpu, RefusesUnsupportedTypesAndMissingDiagonals) {
  SMS_OR_SKIP(sms);
  cuda::AnyScaleTile t{.in_type = Scalar::kFloat64,
                       .out_type = Scalar::kComplex64,
                       .lines = 1,
                       .line_len = 1};
  float dummy_storage[4];
  t.in = dummy_storage;  // never dereferenced
  t.out = dummy_storage;
  t.left = dummy_storage;
  EXPECT_EQ(cuda::LaunchScaleKernel(t, sms, nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
  const cuda::ScaleTile<float, float> none{.lines = 1, .line_len = 1};
  EXPECT_EQ(cuda::LaunchScaleKernel(none, sms, nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
}

// cublasCdgmm / cublasZdgmm through LaunchCublasDgmm, both sides, against the
// reference within a few roundings (cuBLAS may fuse its complex products).
template <typename T>
void CheckCublas() {
  using R = decltype(T::re);
  SMS_OR_SKIP(sms);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  constexpr int64_t kLines = 37, kLen = 53;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<R> u(-2, 2);
  std::vector<T> a(kLines * kLen), d(std::max(kLines, kLen)), out(a.size());
  for (auto& x : a) x = T{u(rng), u(rng)};
  for (auto& x : d) x = T{u(rng), u(rng)};
  T* da = Upload(a.data(), a.size());
  T* dd = Upload(d.data(), d.size());
  T* dc = Upload(out.data(), out.size());
  for (bool per_line : {true, false}) {
    const cuda::DeviceTile<T> tile{.in = da, .out = dc, .diag = dd, .lines = kLines,
                                   .line_len = kLen, .per_line = per_line};
    ASSERT_EQ(cuda::LaunchCublasDgmm(h, tile), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaMemcpy(out.data(), dc, out.size() * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int64_t l = 0; l < kLines; ++l) {
      for (int64_t j = 0; j < kLen; ++j) {
        const std::complex<double> x(a[l * kLen + j].re, a[l * kLen + j].im);
        const T s = d[per_line ? l : j];
        const std::complex<double> want = x * std::complex<double>(s.re, s.im);
        const T got = out[l * kLen + j];
        const double bound = 4 * std::numeric_limits<R>::epsilon() * std::abs(x) *
                             std::hypot(double{s.re}, double{s.im});
        ASSERT_LE(std::abs(std::complex<double>(got.re, got.im) - want), bound)
            << l << "," << j << " per_line " << per_line;
      }
    }
  }
  cudaFree(da);
  cudaFree(dd);
  cudaFree(dc);
  cublasDestroy(h);
}

TEST(CublasComplexDgmm, Complex64MatchesReference) { CheckCublas<Complex64>(); }
TEST(CublasComplexDgmm, Complex128MatchesReference) { CheckCublas<Complex128>(); }

}  // namespace
}  // namespace dgmm
