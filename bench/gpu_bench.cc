// gpu_bench: the GPU engine against its ceilings, measured in one run.
//
//   gpu_bench [--out_dir=DIR] [--commit=SHA] [--quick]
//
// Sections (each printed as markdown; every timing also goes to
// DIR/gpu_bench.csv):
//   1. Ceilings: device-to-device copy of the same bytes, host→device and
//      device→host copies from pinned memory.
//   2. The original question's table (float32, N = 100, 1000, 10000):
//      dense-diagonal SGEMM, cublasSdgmm and our kernel, kernel-only and
//      including pinned host↔device transfers.
//   3. Launch-policy sweep of our kernel (N = 16384).
//   4. Targets, each MET or MISSED with its measured ratio:
//      (a) kernel ≥ 90% of D2D copy bandwidth for N ≥ 8192, f32 and f64;
//      (b) kernel time ≤ cublasSdgmm time;
//      (c) N = 10000 f32 through CudaDevice/JobContext from pinned host
//          memory ≤ 1.25 × the slower one-way pinned copy;
//      (d) N = 30000 f32 (3.6 GB) through a streamed job with a device
//          working set ≤ 1 GiB, every element verified.
// GPU timings: CUDA events after warm-up, median of many runs, random data.
// Host-path timings (c, d): wall clock around the blocking Process calls.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/bench_kernels.h"
#include "service/backends/cuda/cuda_device.h"
#include "service/backends/cuda/cuda_devices.h"
#include "service/backends/cuda/dgmm_kernel.h"

namespace dgmm::bench {
namespace {

void Die(const std::string& what) {
  std::fprintf(stderr, "gpu_bench: %s\n", what.c_str());
  std::exit(1);
}

#define CK(call)                                                         \
  do {                                                                   \
    const cudaError_t ck_err = (call);                                   \
    if (ck_err != cudaSuccess)                                           \
      Die(absl::StrFormat("%s: %s", #call, cudaGetErrorString(ck_err))); \
  } while (0)
#define CB(call)                                                           \
  do {                                                                     \
    const cublasStatus_t cb_st = (call);                                   \
    if (cb_st != CUBLAS_STATUS_SUCCESS)                                    \
      Die(absl::StrFormat("%s: %s", #call, cublasGetStatusString(cb_st))); \
  } while (0)

struct Flags {
  std::string out_dir = ".";
  std::string commit = "unknown";
  bool quick = false;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--out_dir=", 0) == 0) {
      f.out_dir = a.substr(10);
    } else if (a.rfind("--commit=", 0) == 0) {
      f.commit = a.substr(9);
    } else if (a == "--quick") {
      f.quick = true;
    } else {
      Die("unknown flag " + a + " (flags: --out_dir=DIR --commit=SHA --quick)");
    }
  }
  return f;
}

// ------------------------------------------------------------------ output

struct Report {
  FILE* csv = nullptr;
  FILE* md = nullptr;

  void Line(const std::string& s) {
    std::printf("%s\n", s.c_str());
    if (md != nullptr) std::fprintf(md, "%s\n", s.c_str());
  }
  void Csv(const std::string& section, const std::string& method, int64_t n,
           const std::string& dtype, const std::string& variant, double ms,
           double bytes) {
    const double gbps = ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0;
    std::fprintf(csv, "%s,%s,%lld,%s,%s,%.6f,%.0f,%.2f\n", section.c_str(),
                 method.c_str(), static_cast<long long>(n), dtype.c_str(),
                 variant.c_str(), ms, bytes, gbps);
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median milliseconds of `enqueue` on `s`, by CUDA events, after warm-ups.
double TimeMs(cudaStream_t s, int reps, const std::function<void()>& enqueue) {
  double ms = 0;
  CK(dgmm::bench::MedianEventMs(s, reps, enqueue, &ms));
  return ms;
}

// Median wall-clock milliseconds of a blocking host call, after one warm-up.
double WallMs(int reps, const std::function<void()>& run) {
  run();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - t0)
                     .count());
  }
  return Median(ms);
}

int Reps(int64_t bytes) {
  if (bytes < (int64_t{4} << 20)) return 200;
  if (bytes < (int64_t{256} << 20)) return 50;
  return 15;
}

template <typename T>
const char* DTypeLabel() {
  return sizeof(T) == 4 ? "f32" : "f64";
}

// Largest relative error of rows `rows` of out = A·diag(d) (row-major, side
// right) or diag(d)·A (per_line), against float64.
template <typename T>
double SampledError(const T* d_a, const T* d_d, const T* d_c, int64_t n,
                    bool per_line, const std::vector<int64_t>& rows) {
  std::vector<T> a(n), c(n), d(n);
  CK(cudaMemcpy(d.data(), d_d, n * sizeof(T), cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int64_t r : rows) {
    CK(cudaMemcpy(a.data(), d_a + r * n, n * sizeof(T),
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(c.data(), d_c + r * n, n * sizeof(T),
                  cudaMemcpyDeviceToHost));
    for (int64_t j = 0; j < n; ++j) {
      const double want = static_cast<double>(a[j]) * d[per_line ? r : j];
      const double got = c[j];
      if (std::isnan(got)) return INFINITY;
      worst = std::max(worst, std::abs(got - want) / std::abs(want));
    }
  }
  return worst;
}

std::vector<int64_t> SampleRows(int64_t n) {
  std::vector<int64_t> rows = {0, n / 2, n - 1};
  for (int64_t i = 1; i <= 13; ++i) rows.push_back((i * 7919) % n);
  return rows;
}

// ----------------------------------------------------------- the benchmark

class Bench {
 public:
  Bench(const Flags& flags, Report* out) : flags_(flags), out_(out) {}

  void Run();

 private:
  void Header();
  void Ceilings(int64_t bytes, const std::string& label, int64_t n);
  void OriginalTable();
  template <typename T>
  void KernelVsCopy(int64_t n);
  void PolicySweep();
  void DevicePathPinnedAndPageable();
  void StreamedHuge();
  void Targets();

  double CopyMs(int64_t bytes, cudaMemcpyKind kind);
  double BidirectionalMs(const void* host_in, void* host_out, int64_t bytes);

  const Flags flags_;
  Report* out_;
  cudaStream_t s_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  int sms_ = 0;
  std::string gpu_;

  // Collected for the targets.
  struct KernelRow {
    std::string dtype;
    int64_t n;
    bool per_line;
    double kernel_ms, cublas_ms, copy_ms;
  };
  std::vector<KernelRow> kernel_rows_;
  std::vector<KernelRow> table_rows_;  // f32, the original question's sizes
  double c_pipeline_pinned_ms_ = 0, c_pipeline_pageable_ms_ = 0, c_h2d_ms_ = 0,
         c_d2h_ms_ = 0, c_bidir_ms_ = 0, c_streamed_pinned_ms_ = 0;
  double d_ms_ = 0, d_err_ = INFINITY;
  int64_t d_footprint_ = 0, d_pool_high_ = 0, d_bad_ = -1;
};

void Bench::Header() {
  int dev = 0, driver = 0, runtime = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, dev));
  CK(cudaDriverGetVersion(&driver));
  CK(cudaRuntimeGetVersion(&runtime));
  sms_ = p.multiProcessorCount;
  gpu_ = p.name;
  out_->Line(absl::StrFormat(
      "# dgmm GPU benchmark\n\n- GPU: %s (%d SMs, %.1f GiB, "
      "L2 %d MiB)\n- driver %d, runtime %d\n- commit: %s\n",
      p.name, p.multiProcessorCount, p.totalGlobalMem / 1073741824.0,
      p.l2CacheSize >> 20, driver, runtime, flags_.commit));
}

// H2D of `bytes` from `host_in` and D2H of as many into `host_out`, at once
// on two streams; median ms until both are done.
double Bench::BidirectionalMs(const void* host_in, void* host_out,
                              int64_t bytes) {
  void *d_in = nullptr, *d_out = nullptr;
  CK(cudaMalloc(&d_in, bytes));
  CK(cudaMalloc(&d_out, bytes));
  CK(cudaMemset(d_out, 0x3f, bytes));
  cudaStream_t other;
  cudaEvent_t fork, join;
  CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  const double ms = TimeMs(s_, Reps(bytes), [&] {
    CK(cudaEventRecord(fork, s_));
    CK(cudaStreamWaitEvent(other, fork, 0));
    CK(cudaMemcpyAsync(d_in, host_in, bytes, cudaMemcpyHostToDevice, s_));
    CK(cudaMemcpyAsync(host_out, d_out, bytes, cudaMemcpyDeviceToHost, other));
    CK(cudaEventRecord(join, other));
    CK(cudaStreamWaitEvent(s_, join, 0));
  });
  CK(cudaEventDestroy(fork));
  CK(cudaEventDestroy(join));
  CK(cudaStreamDestroy(other));
  CK(cudaFree(d_in));
  CK(cudaFree(d_out));
  return ms;
}

double Bench::CopyMs(int64_t bytes, cudaMemcpyKind kind) {
  void *src = nullptr, *dst = nullptr;
  const bool src_host = kind == cudaMemcpyHostToDevice;
  const bool dst_host = kind == cudaMemcpyDeviceToHost;
  if (src_host) {
    CK(cudaHostAlloc(&src, bytes, 0));
    std::memset(src, 0x3f, bytes);
  } else {
    CK(cudaMalloc(&src, bytes));
    CK(FillRandom(static_cast<float*>(src), bytes / 4, 99, s_));
  }
  if (dst_host) {
    CK(cudaHostAlloc(&dst, bytes, 0));
  } else {
    CK(cudaMalloc(&dst, bytes));
  }
  const double ms = TimeMs(
      s_, Reps(bytes), [&] { CK(cudaMemcpyAsync(dst, src, bytes, kind, s_)); });
  CK(src_host ? cudaFreeHost(src) : cudaFree(src));
  CK(dst_host ? cudaFreeHost(dst) : cudaFree(dst));
  return ms;
}

void Bench::OriginalTable() {
  out_->Line(
      "## The original question's table (float32, C = A·diag(d), row-major)\n\n"
      "Median ms. \"+ transfers\": pinned A (and d, or the dense diag(d) for "
      "GEMM) host→device, the multiply, C device→host, on one stream with no "
      "overlap, as in the question. Ceilings: D2D copy of the matrix (read + "
      "write), one-way pinned copies.\n");
  out_->Line(
      "| N | SGEMM dense diag | SGEMM + transfers | cublasSdgmm | Sdgmm + "
      "transfers "
      "| our kernel | kernel + transfers | D2D copy | H2D | D2H | max rel err "
      "(gemm/dgmm/kernel) |");
  out_->Line("|---|---|---|---|---|---|---|---|---|---|---|");
  for (int64_t n : {int64_t{100}, int64_t{1000}, int64_t{10000}}) {
    const int64_t elems = n * n, bytes = elems * 4;
    float *a, *dense, *d, *c, *ha, *hdense, *hd, *hc;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&dense, bytes));
    CK(cudaMalloc(&d, n * 4));
    CK(cudaMalloc(&c, bytes));
    CK(cudaHostAlloc(&ha, bytes, 0));
    CK(cudaHostAlloc(&hdense, bytes, 0));
    CK(cudaHostAlloc(&hd, n * 4, 0));
    CK(cudaHostAlloc(&hc, bytes, 0));
    CK(FillRandom(a, elems, 1, s_));
    CK(FillRandom(d, n, 2, s_));
    CK(cudaMemsetAsync(dense, 0, bytes, s_));
    CK(cudaMemcpy2DAsync(dense, (n + 1) * 4, d, 4, 4, n,
                         cudaMemcpyDeviceToDevice, s_));
    CK(cudaMemcpyAsync(ha, a, bytes, cudaMemcpyDeviceToHost, s_));
    CK(cudaMemcpyAsync(hdense, dense, bytes, cudaMemcpyDeviceToHost, s_));
    CK(cudaMemcpyAsync(hd, d, n * 4, cudaMemcpyDeviceToHost, s_));
    CK(cudaStreamSynchronize(s_));
    const cuda::DeviceTile<float> tile{.in = a,
                                       .out = c,
                                       .diag = d,
                                       .lines = n,
                                       .line_len = n,
                                       .per_line = false};
    const float one = 1, zero = 0;
    // Row-major C = A·D is column-major Cᵀ = D·Aᵀ.
    auto gemm = [&] {
      CB(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, dense, n,
                     a, n, &zero, c, n));
    };
    auto dgmm = [&] { CB(cuda::LaunchCublasDgmm(blas_, tile)); };
    auto kernel = [&] { CK(cuda::LaunchDgmmKernel(tile, sms_, s_)); };
    auto with_transfers = [&](const std::function<void()>& op,
                              bool dense_diag) {
      return [&, op, dense_diag] {
        CK(cudaMemcpyAsync(a, ha, bytes, cudaMemcpyHostToDevice, s_));
        if (dense_diag) {
          CK(cudaMemcpyAsync(dense, hdense, bytes, cudaMemcpyHostToDevice, s_));
        } else {
          CK(cudaMemcpyAsync(d, hd, n * 4, cudaMemcpyHostToDevice, s_));
        }
        op();
        CK(cudaMemcpyAsync(hc, c, bytes, cudaMemcpyDeviceToHost, s_));
      };
    };
    const int reps = n >= 10000 ? 7 : Reps(bytes);
    const auto rows = SampleRows(n);
    const double gemm_ms = TimeMs(s_, reps, gemm);
    const double gemm_err = SampledError(a, d, c, n, false, rows);
    const double gemm_t = TimeMs(s_, reps, with_transfers(gemm, true));
    CK(cudaMemsetAsync(c, 0xff, bytes, s_));
    const double dgmm_ms = TimeMs(s_, Reps(bytes), dgmm);
    const double dgmm_err = SampledError(a, d, c, n, false, rows);
    const double dgmm_t = TimeMs(s_, Reps(bytes), with_transfers(dgmm, false));
    CK(cudaMemsetAsync(c, 0xff, bytes, s_));
    const double k_ms = TimeMs(s_, Reps(bytes), kernel);
    const double k_err = SampledError(a, d, c, n, false, rows);
    const double k_t = TimeMs(s_, Reps(bytes), with_transfers(kernel, false));
    const double d2d = CopyMs(bytes, cudaMemcpyDeviceToDevice);
    const double h2d = CopyMs(bytes, cudaMemcpyHostToDevice);
    const double d2h = CopyMs(bytes, cudaMemcpyDeviceToHost);
    out_->Line(absl::StrFormat(
        "| %d | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | "
        "%.1e / %.1e / %.1e |",
        n, gemm_ms, gemm_t, dgmm_ms, dgmm_t, k_ms, k_t, d2d, h2d, d2h, gemm_err,
        dgmm_err, k_err));
    const double rw = 2.0 * bytes;
    out_->Csv("table", "sgemm_dense_diag", n, "f32", "kernel_only", gemm_ms,
              rw);
    out_->Csv("table", "sgemm_dense_diag", n, "f32", "with_transfers", gemm_t,
              3.0 * bytes);
    out_->Csv("table", "cublas_sdgmm", n, "f32", "kernel_only", dgmm_ms, rw);
    out_->Csv("table", "cublas_sdgmm", n, "f32", "with_transfers", dgmm_t, rw);
    out_->Csv("table", "dgmm_kernel", n, "f32", "kernel_only", k_ms, rw);
    out_->Csv("table", "dgmm_kernel", n, "f32", "with_transfers", k_t, rw);
    out_->Csv("table", "d2d_copy", n, "f32", "ceiling", d2d, rw);
    out_->Csv("table", "h2d_pinned", n, "f32", "ceiling", h2d, bytes);
    out_->Csv("table", "d2h_pinned", n, "f32", "ceiling", d2h, bytes);
    table_rows_.push_back({"f32", n, false, k_ms, dgmm_ms, d2d});
    if (k_err > 1.2e-7 || dgmm_err > 1.2e-7 || gemm_err > 1e-6) {
      out_->Line(absl::StrFormat("**WRONG RESULT at N=%d**", n));
    }
    for (void* p : {static_cast<void*>(a), static_cast<void*>(dense),
                    static_cast<void*>(d), static_cast<void*>(c)}) {
      CK(cudaFree(p));
    }
    for (void* p : {static_cast<void*>(ha), static_cast<void*>(hdense),
                    static_cast<void*>(hd), static_cast<void*>(hc)}) {
      CK(cudaFreeHost(p));
    }
  }
  out_->Line("");
}

template <typename T>
void Bench::KernelVsCopy(int64_t n) {
  const int64_t elems = n * n, bytes = elems * static_cast<int64_t>(sizeof(T));
  T *a, *c, *d;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&c, bytes));
  CK(cudaMalloc(&d, n * sizeof(T)));
  CK(FillRandom(a, elems, 3, s_));
  CK(FillRandom(d, n, 4, s_));
  const double copy = TimeMs(s_, Reps(bytes), [&] {
    CK(cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, s_));
  });
  for (bool per_line : {false, true}) {
    const cuda::DeviceTile<T> tile{.in = a,
                                   .out = c,
                                   .diag = d,
                                   .lines = n,
                                   .line_len = n,
                                   .per_line = per_line};
    CK(cudaMemsetAsync(c, 0xff, bytes, s_));
    const double k = TimeMs(
        s_, Reps(bytes), [&] { CK(cuda::LaunchDgmmKernel(tile, sms_, s_)); });
    const double err = SampledError(a, d, c, n, per_line, SampleRows(n));
    const double b = TimeMs(s_, Reps(bytes),
                            [&] { CB(cuda::LaunchCublasDgmm(blas_, tile)); });
    const char* mode = per_line ? "scale_rows" : "scale_cols";
    out_->Line(absl::StrFormat(
        "| %s | %d | %s | %.4f | %.0f | %.4f | %.0f | %.4f | %.0f | %.3f | "
        "%.1e |",
        DTypeLabel<T>(), n, mode, k, 2.0 * bytes / k / 1e6, b,
        2.0 * bytes / b / 1e6, copy, 2.0 * bytes / copy / 1e6, copy / k, err));
    out_->Csv("kernel", "dgmm_kernel", n, DTypeLabel<T>(), mode, k,
              2.0 * bytes);
    out_->Csv("kernel", "cublas_dgmm", n, DTypeLabel<T>(), mode, b,
              2.0 * bytes);
    kernel_rows_.push_back({DTypeLabel<T>(), n, per_line, k, b, copy});
    if (err > (sizeof(T) == 4 ? 1.2e-7 : 4.5e-16)) {
      out_->Line(absl::StrFormat("**WRONG RESULT %s N=%d %s**", DTypeLabel<T>(),
                                 n, mode));
    }
  }
  out_->Csv("kernel", "d2d_copy", n, DTypeLabel<T>(), "ceiling", copy,
            2.0 * bytes);
  CK(cudaFree(a));
  CK(cudaFree(c));
  CK(cudaFree(d));
}

void Bench::PolicySweep() {
  out_->Line(
      "## Launch-policy sweep (N = 16384, scale_cols; block 256 threads)\n\n"
      "| dtype | vector | items/thread | grid blocks | ms | GB/s |\n"
      "|---|---|---|---|---|---|");
  auto sweep = [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = 16384, elems = n * n, bytes = elems * sizeof(T);
    T *a, *c, *d;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&c, bytes));
    CK(cudaMalloc(&d, n * sizeof(T)));
    CK(FillRandom(a, elems, 5, s_));
    CK(FillRandom(d, n, 6, s_));
    const cuda::DeviceTile<T> tile{.in = a,
                                   .out = c,
                                   .diag = d,
                                   .lines = n,
                                   .line_len = n,
                                   .per_line = false};
    const cuda::LaunchPolicy chosen = cuda::ChooseLaunchPolicy(tile, sms_);
    const int vec = 16 / sizeof(T);
    for (int items : {1, 2, 4}) {
      const int64_t needed = elems / vec / (256 * items);
      for (int64_t grid :
           {int64_t{sms_} * 4, int64_t{sms_} * 8, int64_t{sms_} * 32, needed}) {
        const cuda::LaunchPolicy p{.block_threads = 256,
                                   .grid_blocks = static_cast<int>(grid),
                                   .vector_width = vec,
                                   .items_per_thread = items};
        const double ms =
            TimeMs(s_, 30, [&] { CK(cuda::LaunchDgmmKernel(tile, p, s_)); });
        const bool is_chosen =
            items == chosen.items_per_thread && grid == chosen.grid_blocks;
        out_->Line(absl::StrFormat("| %s | %d | %d | %d%s | %.4f | %.0f |",
                                   DTypeLabel<T>(), vec, items, grid,
                                   is_chosen ? " (default)" : "", ms,
                                   2.0 * bytes / ms / 1e6));
        out_->Csv("policy", absl::StrFormat("items%d_grid%d", items, grid), n,
                  DTypeLabel<T>(), "scale_cols", ms, 2.0 * bytes);
      }
    }
    CK(cudaFree(a));
    CK(cudaFree(c));
    CK(cudaFree(d));
  };
  sweep(float{});
  sweep(double{});
  out_->Line("");
}

// Fills a host buffer with random floats in ±[0.5, 2), in parallel.
void FillHost(float* p, int64_t n, uint64_t seed) {
  const int threads =
      std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
      uint64_t x = seed * 0x9e3779b97f4a7c15ull + t;
      for (int64_t i = lo; i < hi; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const float v =
            0.5f + 1.5f * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
        p[i] = (x & 1) ? v : -v;
      }
    });
  }
  for (auto& t : pool) t.join();
}

// Counts elements of a row-major n×n float product (side right) that differ
// from the float64 reference by more than one float rounding, in parallel.
int64_t CountWrong(const float* a, const float* d, const float* c, int64_t rows,
                   int64_t n, double* worst) {
  const int threads =
      std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<int64_t> bad(threads, 0);
  std::vector<double> w(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t r = rows * t / threads; r < rows * (t + 1) / threads; ++r) {
        for (int64_t j = 0; j < n; ++j) {
          const double want = static_cast<double>(a[r * n + j]) * d[j];
          const double err = std::abs(c[r * n + j] - want) / std::abs(want);
          if (!(err <= 0x1p-24)) ++bad[t];
          if (!(err <= w[t])) w[t] = err;
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  *worst = *std::max_element(w.begin(), w.end());
  int64_t total = 0;
  for (int64_t b : bad) total += b;
  return total;
}

void Bench::DevicePathPinnedAndPageable() {
  const int64_t n = 10000, elems = n * n, bytes = elems * 4;
  CudaOptions opts;  // the service's defaults: 3 streams, 8 MiB pieces
  std::string why;
  auto devices = CreateCudaDevices(opts, &why);
  if (!devices.ok() || devices->empty()) Die("no CUDA device: " + why);
  Device* dev = (*devices)[0].get();
  out_->Line(absl::StrFormat(
      "## Through CudaDevice/JobContext (N = %d, float32, scale_cols, default "
      "options: "
      "%d streams, %d pieces in flight, %d MiB pieces; backends() order: %s "
      "first)\n",
      n, opts.streams, static_cast<cuda::CudaDevice*>(dev)->pieces_in_flight(),
      static_cast<int>(opts.tile_bytes >> 20),
      dev->backends()[0] == BackendKind::kCublas ? "cublas" : "cuda-kernel"));
  const Problem p{.rows = n,
                  .cols = n,
                  .dtype = DType::kFloat32,
                  .layout = Layout::kRowMajor,
                  .side = Side::kRight};
  float *pin_in, *pin_out;
  CK(cudaHostAlloc(&pin_in, bytes, 0));
  CK(cudaHostAlloc(&pin_out, bytes, 0));
  std::vector<float> page_in(elems), page_out(elems), diag(n);
  FillHost(pin_in, elems, 1);
  std::memcpy(page_in.data(), pin_in, bytes);
  FillHost(diag.data(), n, 2);
  const auto* dbytes = reinterpret_cast<const std::byte*>(diag.data());

  auto run = [&](const float* in, float* out, JobMode mode, BackendKind backend,
                 int64_t block_lines) {
    auto job =
        dev->Begin(p, backend, dbytes, mode, block_lines * p.line_bytes());
    if (!job.ok()) Die(std::string(job.status().message()));
    for (int64_t first = 0; first < n; first += block_lines) {
      const int64_t lines = std::min(block_lines, n - first);
      const Tile t{.in = reinterpret_cast<const std::byte*>(in + first * n),
                   .out = reinterpret_cast<std::byte*>(out + first * n),
                   .first_line = first,
                   .lines = lines};
      if (auto st = (*job)->Process(t, nullptr, nullptr); !st.ok()) {
        Die(std::string(st.message()));
      }
    }
  };
  c_h2d_ms_ = CopyMs(bytes, cudaMemcpyHostToDevice);
  c_d2h_ms_ = CopyMs(bytes, cudaMemcpyDeviceToHost);
  c_bidir_ms_ = BidirectionalMs(pin_in, pin_out, bytes);
  const int reps = flags_.quick ? 3 : 9;
  out_->Line(
      "| host memory | job mode | backend | ms | GB/s (matrix bytes one way) | "
      "max rel err |\n|---|---|---|---|---|---|");
  struct Case {
    const char* memory;
    bool pinned;
    JobMode mode;
    BackendKind backend;
  };
  for (const Case& k :
       {Case{"pinned", true, JobMode::kWhole, BackendKind::kCudaKernel},
        Case{"pinned", true, JobMode::kWhole, BackendKind::kCublas},
        Case{"pinned", true, JobMode::kStreamed, BackendKind::kCudaKernel},
        Case{"pageable", false, JobMode::kWhole, BackendKind::kCudaKernel},
        Case{"pageable", false, JobMode::kStreamed,
             BackendKind::kCudaKernel}}) {
    const float* in = k.pinned ? pin_in : page_in.data();
    float* out = k.pinned ? pin_out : page_out.data();
    // Streamed jobs arrive as 64 MiB blocks, as MultiplyStream would feed them.
    const int64_t block_lines =
        k.mode == JobMode::kWhole ? n : (int64_t{64} << 20) / p.line_bytes();
    std::memset(out, 0xff, bytes);
    const double ms =
        WallMs(reps, [&] { run(in, out, k.mode, k.backend, block_lines); });
    double worst = 0;
    const int64_t wrong = CountWrong(in, diag.data(), out, n, n, &worst);
    out_->Line(absl::StrFormat(
        "| %s | %s | %s | %.3f | %.1f | %.1e%s |", k.memory,
        k.mode == JobMode::kWhole ? "whole" : "streamed 64 MiB",
        k.backend == BackendKind::kCublas ? "cublas" : "kernel", ms,
        bytes / ms / 1e6, worst,
        wrong ? absl::StrFormat(" (**%d wrong**)", wrong) : ""));
    out_->Csv("device_path",
              absl::StrFormat(
                  "%s_%s", k.mode == JobMode::kWhole ? "whole" : "streamed",
                  k.backend == BackendKind::kCublas ? "cublas" : "kernel"),
              n, "f32", k.memory, ms, bytes);
    if (k.pinned && k.mode == JobMode::kWhole &&
        k.backend == BackendKind::kCudaKernel) {
      c_pipeline_pinned_ms_ = wrong ? INFINITY : ms;
    }
    if (k.pinned && k.mode == JobMode::kStreamed)
      c_streamed_pinned_ms_ = wrong ? INFINITY : ms;
    if (!k.pinned && k.mode == JobMode::kWhole)
      c_pipeline_pageable_ms_ = wrong ? INFINITY : ms;
  }
  out_->Line(
      absl::StrFormat("\nPinned copies of the same %d MB: H2D alone %.3f ms, "
                      "D2H alone %.3f ms, "
                      "H2D and D2H at once on two streams %.3f ms (the "
                      "full-duplex ceiling of a "
                      "pipeline that moves the matrix in and out).\n",
                      bytes / 1000000, c_h2d_ms_, c_d2h_ms_, c_bidir_ms_));
  out_->Csv("device_path", "h2d_d2h_concurrent", n, "f32", "ceiling",
            c_bidir_ms_, bytes);
  // Pipeline shape: streams × pieces in flight × piece size.
  out_->Line(
      "Pipeline shape sweep (pinned, whole job, kernel; median ms):\n\n"
      "| streams | pieces in flight | 4 MiB | 8 MiB | 16 MiB "
      "|\n|---|---|---|---|---|");
  for (auto [streams, depth] : std::vector<std::pair<int, int>>{
           {3, 3}, {3, 6}, {4, 4}, {4, 8}, {6, 6}, {6, 12}, {8, 8}, {8, 16}}) {
    std::string row = absl::StrFormat("| %d | %d |", streams, depth);
    for (int64_t mib : {4, 8, 16}) {
      CudaOptions o;
      o.streams = streams;
      o.pieces_in_flight = depth;
      o.tile_bytes = mib << 20;
      o.measure_backend_order = false;
      auto devs = CreateCudaDevices(o, &why);
      if (!devs.ok() || devs->empty()) Die("no CUDA device: " + why);
      Device* sweep_dev = (*devs)[0].get();
      const double ms = WallMs(flags_.quick ? 2 : 5, [&] {
        auto job = sweep_dev->Begin(p, BackendKind::kCudaKernel, dbytes,
                                    JobMode::kWhole, p.matrix_bytes());
        if (!job.ok()) Die(std::string(job.status().message()));
        const Tile t{.in = reinterpret_cast<const std::byte*>(pin_in),
                     .out = reinterpret_cast<std::byte*>(pin_out),
                     .first_line = 0,
                     .lines = n};
        if (auto st = (*job)->Process(t, nullptr, nullptr); !st.ok()) {
          Die(std::string(st.message()));
        }
      });
      row += absl::StrFormat(" %.3f |", ms);
      out_->Csv(
          "pipeline_sweep",
          absl::StrFormat("streams%d_depth%d_piece%dMiB", streams, depth, mib),
          n, "f32", "pinned", ms, bytes);
    }
    out_->Line(row);
  }
  out_->Line("");
  out_->Csv("device_path", "h2d_pinned", n, "f32", "ceiling", c_h2d_ms_, bytes);
  out_->Csv("device_path", "d2h_pinned", n, "f32", "ceiling", c_d2h_ms_, bytes);
  CK(cudaFreeHost(pin_in));
  CK(cudaFreeHost(pin_out));
}

void Bench::StreamedHuge() {
  const int64_t n = flags_.quick ? 12000 : 30000, elems = n * n,
                bytes = elems * 4;
  CudaOptions opts;
  std::string why;
  auto devices = CreateCudaDevices(opts, &why);
  if (!devices.ok() || devices->empty()) Die("no CUDA device: " + why);
  auto* dev = static_cast<cuda::CudaDevice*>((*devices)[0].get());
  const Problem p{.rows = n,
                  .cols = n,
                  .dtype = DType::kFloat32,
                  .layout = Layout::kRowMajor,
                  .side = Side::kRight};
  const int64_t block_lines = (int64_t{64} << 20) / p.line_bytes();
  d_footprint_ =
      dev->Footprint(p, JobMode::kStreamed, block_lines * p.line_bytes());
  std::unique_ptr<float[]> in(new float[elems]), out(new float[elems]);
  std::vector<float> diag(n);
  FillHost(in.get(), elems, 3);
  FillHost(diag.data(), n, 4);
  std::memset(out.get(), 0xff, bytes);
  if (!dev->ResetPoolHighWater().ok()) Die("pool reset");
  const auto t0 = std::chrono::steady_clock::now();
  auto job = dev->Begin(p, dev->backends()[0],
                        reinterpret_cast<const std::byte*>(diag.data()),
                        JobMode::kStreamed, block_lines * p.line_bytes());
  if (!job.ok()) Die(std::string(job.status().message()));
  StageTimes times;
  for (int64_t first = 0; first < n; first += block_lines) {
    const int64_t lines = std::min(block_lines, n - first);
    const Tile t{.in = reinterpret_cast<const std::byte*>(in.get() + first * n),
                 .out = reinterpret_cast<std::byte*>(out.get() + first * n),
                 .first_line = first,
                 .lines = lines};
    if (auto st = (*job)->Process(t, nullptr, &times); !st.ok()) {
      Die(std::string(st.message()));
    }
  }
  job->reset();
  d_ms_ = std::chrono::duration<double, std::milli>(
              std::chrono::steady_clock::now() - t0)
              .count();
  auto high = dev->PoolHighWaterBytes();
  d_pool_high_ = high.ok() ? *high : -1;
  d_bad_ = CountWrong(in.get(), diag.data(), out.get(), n, n, &d_err_);
  out_->Line(absl::StrFormat(
      "## Streamed job, N = %d float32 (%.2f GB), pageable host memory, 64 MiB "
      "blocks\n\n"
      "- wall time %.1f ms (%.1f GB/s of matrix one way); stage sums: h2d %.1f "
      "ms, "
      "compute %.1f ms, d2h %.1f ms (host staging copies included in h2d/d2h)\n"
      "- footprint (budget) %.1f MiB; device pool high-water %.1f MiB\n"
      "- verified every element against float64: %d wrong, max rel err %.2e\n",
      n, bytes / 1e9, d_ms_, bytes / d_ms_ / 1e6,
      absl::ToDoubleMilliseconds(times.h2d),
      absl::ToDoubleMilliseconds(times.compute),
      absl::ToDoubleMilliseconds(times.d2h), d_footprint_ / 1048576.0,
      d_pool_high_ / 1048576.0, d_bad_, d_err_));
  out_->Csv("streamed_huge", "streamed_kernel", n, "f32", "pageable", d_ms_,
            bytes);
}

void Bench::Targets() {
  out_->Line(
      "## Targets\n\n| target | measured | ratio | verdict "
      "|\n|---|---|---|---|");
  auto verdict = [](bool ok) { return ok ? "MET" : "MISSED"; };
  // (a)
  double worst_a = INFINITY;
  std::string where_a;
  for (const auto& r : kernel_rows_) {
    if (r.n < 8192) continue;
    const double ratio = r.copy_ms / r.kernel_ms;
    if (ratio < worst_a) {
      worst_a = ratio;
      where_a = absl::StrFormat("%s N=%d %s", r.dtype, r.n,
                                r.per_line ? "scale_rows" : "scale_cols");
    }
  }
  out_->Line(
      absl::StrFormat("| (a) kernel ≥ 90%% of D2D copy bandwidth, N ≥ 8192, "
                      "f32 and f64 (worst case) "
                      "| worst: %s | %.3f | %s |",
                      where_a, worst_a, verdict(worst_a >= 0.9)));
  // (b)
  double worst_b = 0;
  std::string where_b;
  for (const auto& rows : {table_rows_, kernel_rows_}) {
    for (const auto& r : rows) {
      if (r.dtype != "f32") continue;
      const double ratio = r.kernel_ms / r.cublas_ms;
      if (ratio > worst_b) {
        worst_b = ratio;
        where_b = absl::StrFormat("N=%d %s", r.n,
                                  r.per_line ? "scale_rows" : "scale_cols");
      }
    }
  }
  out_->Line(
      absl::StrFormat("| (b) kernel time ≤ cublasSdgmm time (every f32 size, "
                      "worst case) | worst: %s "
                      "| %.3f | %s |",
                      where_b, worst_b, verdict(worst_b <= 1.0)));
  double worst_b_large = 0;
  for (const auto& rows : {table_rows_, kernel_rows_}) {
    for (const auto& r : rows) {
      if (r.dtype == "f32" && r.n >= 1000) {
        worst_b_large = std::max(worst_b_large, r.kernel_ms / r.cublas_ms);
      }
    }
  }
  out_->Line(
      absl::StrFormat("| (b, N ≥ 1000) same, leaving out N = 100 (both at the "
                      "~6 µs launch floor) | "
                      "worst ratio | %.3f | %s |",
                      worst_b_large, verdict(worst_b_large <= 1.0)));
  // (c)
  const double slower = std::max(c_h2d_ms_, c_d2h_ms_);
  out_->Line(absl::StrFormat(
      "| (c) N=10000 f32 via CudaDevice (pinned host memory, whole job) ≤ 1.25 "
      "× slower "
      "one-way pinned copy | %.3f ms vs %.3f ms | %.3f | %s |",
      c_pipeline_pinned_ms_, slower, c_pipeline_pinned_ms_ / slower,
      verdict(c_pipeline_pinned_ms_ <= 1.25 * slower)));
  out_->Line(absl::StrFormat(
      "| (c, context) same job against the measured full-duplex ceiling (H2D "
      "and D2H "
      "at once) | %.3f ms vs %.3f ms | %.3f | %s |",
      c_pipeline_pinned_ms_, c_bidir_ms_, c_pipeline_pinned_ms_ / c_bidir_ms_,
      verdict(c_pipeline_pinned_ms_ <= 1.25 * c_bidir_ms_)));
  out_->Line(
      absl::StrFormat("| (c') same, streamed job in 64 MiB blocks, pinned | "
                      "%.3f ms | %.3f | %s |",
                      c_streamed_pinned_ms_, c_streamed_pinned_ms_ / slower,
                      verdict(c_streamed_pinned_ms_ <= 1.25 * slower)));
  out_->Line(
      absl::StrFormat("| (c'') same, whole job, pageable host memory (for "
                      "information) | %.3f ms | %.3f "
                      "| %s |",
                      c_pipeline_pageable_ms_, c_pipeline_pageable_ms_ / slower,
                      verdict(c_pipeline_pageable_ms_ <= 1.25 * slower)));
  // (d)
  const int64_t gib = int64_t{1} << 30;
  const bool d_ok = d_bad_ == 0 && d_footprint_ <= gib && d_pool_high_ >= 0 &&
                    d_pool_high_ <= gib;
  out_->Line(absl::StrFormat(
      "| (d) N=%d f32 streamed, device working set ≤ 1 GiB, verified | "
      "footprint %.1f "
      "MiB, pool high-water %.1f MiB, %d wrong | %.4f | %s |",
      flags_.quick ? 12000 : 30000, d_footprint_ / 1048576.0,
      d_pool_high_ / 1048576.0, d_bad_,
      static_cast<double>(std::max(d_footprint_, d_pool_high_)) / gib,
      verdict(d_ok)));
  out_->Line("");
}

void Bench::Run() {
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  CB(cublasCreate(&blas_));
  CB(cublasSetStream(blas_, s_));
  Header();
  OriginalTable();
  out_->Line(
      "## Kernel vs the D2D copy ceiling (median ms; GB/s counts read + "
      "write)\n\n"
      "| dtype | N | mode | our kernel ms | GB/s | cublas dgmm ms | GB/s | D2D "
      "copy ms "
      "| GB/s | kernel/copy bandwidth | max rel err "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|");
  for (int64_t n : {int64_t{1000}, int64_t{4096}, int64_t{8192}, int64_t{10000},
                    int64_t{16384}}) {
    KernelVsCopy<float>(n);
  }
  for (int64_t n : {int64_t{4096}, int64_t{8192}, int64_t{16384}})
    KernelVsCopy<double>(n);
  out_->Line("");
  PolicySweep();
  DevicePathPinnedAndPageable();
  StreamedHuge();
  Targets();
  CB(cublasDestroy(blas_));
  CK(cudaStreamDestroy(s_));
}

}  // namespace
}  // namespace dgmm::bench

int main(int argc, char** argv) {
  using namespace dgmm::bench;
  const Flags flags = ParseFlags(argc, argv);
  Report report;
  report.csv = std::fopen((flags.out_dir + "/gpu_bench.csv").c_str(), "w");
  report.md = std::fopen((flags.out_dir + "/gpu_bench.md").c_str(), "w");
  if (report.csv == nullptr || report.md == nullptr)
    Die("cannot write to " + flags.out_dir);
  std::fprintf(report.csv,
               "section,method,n,dtype,variant,ms_median,bytes,gbps\n");
  Bench(flags, &report).Run();
  std::fclose(report.csv);
  std::fclose(report.md);
  return 0;
}
