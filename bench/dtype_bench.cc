// dtype_bench: the kernels of every dtype and the two-sided kernel against their ceiling, on the GPU.
//
//   dtype_bench [--n=10000] [--reps=30] [--out=FILE.md] [--only=promoted]
//
// For every element type (float16, bfloat16, float32, float64, complex64,
// complex128) on an N x N matrix: a device-to-device cudaMemcpy of the same
// bytes (the ceiling), dgmm's kernel one-sided (diagonal per line, per
// position), two-sided (left per line = row-major, left per position =
// column-major), two one-sided launches doing the same (the second in
// place), and cuBLAS <t>dgmm for the types cuBLAS has (two-sided = two
// calls). Then every promoted pair the kernel has (A narrower than C),
// two-sided, against a copy moving as many bytes, with one vector per
// thread beside the policy's two for the record. Every GPU time is the
// median of --reps runs by CUDA events, after 3 warm-ups, on random data.
// Targets printed MET/MISSED: every kernel >= 0.95 x the D2D copy's
// bandwidth (copy_ms / kernel_ms); two-sided / two one-sided <= 0.55.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdarg>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_kernels.h"
#include "service/backends/cuda/dgmm_kernel.h"

namespace dgmm::bench {
namespace {

void Die(const std::string& what) {
  std::fprintf(stderr, "dtype_bench: %s\n", what.c_str());
  std::exit(1);
}
#define CK(call)                                                                     \
  do {                                                                               \
    const cudaError_t ck_err = (call);                                               \
    if (ck_err != cudaSuccess) Die(std::string(#call) + ": " + cudaGetErrorString(ck_err)); \
  } while (0)
#define CB(call)                                                                       \
  do {                                                                                 \
    const cublasStatus_t cb_st = (call);                                               \
    if (cb_st != CUBLAS_STATUS_SUCCESS) Die(std::string(#call) + ": " + cublasGetStatusString(cb_st)); \
  } while (0)

int64_t g_n = 10000;
int g_reps = 30;
FILE* g_md = nullptr;
cudaStream_t g_s = nullptr;
int g_sms = 0;
cublasHandle_t g_blas = nullptr;
int g_met = 0, g_missed = 0;
bool g_only_promoted = false;

void Line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Line(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::printf("%s\n", buf);
  std::fflush(stdout);
  if (g_md != nullptr) std::fprintf(g_md, "%s\n", buf);
}

double TimeMs(const std::function<void()>& enqueue) {
  double ms = 0;
  CK(MedianEventMs(g_s, g_reps, enqueue, &ms));
  return ms;
}

// Random bytes for any type: float patterns for 2-, 4- and 8-byte-element
// types whose halves are floats, doubles for the double-based ones. The
// timing does not depend on the values (no subnormal slow path on the GPU).
void Fill(void* p, int64_t bytes, bool doubles, uint64_t seed) {
  if (doubles) {
    CK(FillRandom(static_cast<double*>(p), bytes / 8, seed, g_s));
  } else {
    CK(FillRandom(static_cast<float*>(p), bytes / 4, seed, g_s));
  }
}

const char* Mark(bool met) {
  (met ? g_met : g_missed)++;
  return met ? "MET" : "MISSED";
}

void Row(const char* dtype, const char* what, double ms, double copy_ms, int64_t bytes,
         bool target) {
  const double ratio = copy_ms / ms;
  Line("| %s | %s | %.4f | %.0f | %.3f | %s |", dtype, what, ms, 2.0 * bytes / (ms * 1e6), ratio,
       target ? Mark(ratio >= 0.95) : "(info)");
}

template <typename T>
struct CublasOf {
  static constexpr bool kHas = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                               std::is_same_v<T, Complex64> || std::is_same_v<T, Complex128>;
};

template <typename T>
void OneType(const char* name) {
  using K = Compute<T>;
  constexpr bool kDoubles = std::is_same_v<T, double> || std::is_same_v<T, Complex128>;
  const int64_t n = g_n, elems = n * n, bytes = elems * sizeof(T);
  T *a = nullptr, *c = nullptr;
  K *l = nullptr, *r = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&c, bytes));
  CK(cudaMalloc(&l, n * sizeof(K)));
  CK(cudaMalloc(&r, n * sizeof(K)));
  Fill(a, bytes, kDoubles, 1);
  Fill(l, n * sizeof(K), kDoubles, 2);
  Fill(r, n * sizeof(K), kDoubles, 3);
  CK(cudaStreamSynchronize(g_s));

  const double copy = TimeMs([&] { CK(cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, g_s)); });
  Line("| %s | D2D cudaMemcpy (ceiling) | %.4f | %.0f | 1.000 | |", name, copy, 2.0 * bytes / (copy * 1e6));
  auto tile = [&](const K* left, const K* right, bool left_per_line, const T* in, T* out) {
    return cuda::ScaleTile<T, T>{.in = in, .out = out, .left = left, .right = right,
                                 .left_per_line = left_per_line, .lines = n, .line_len = n};
  };
  auto launch = [&](const cuda::ScaleTile<T, T>& t) { CK(cuda::LaunchScaleKernel(t, g_sms, g_s)); };
  const auto per_line = tile(l, nullptr, true, a, c), per_pos = tile(nullptr, r, true, a, c);
  const auto both_row = tile(l, r, true, a, c), both_col = tile(l, r, false, a, c);
  const int vec = cuda::ChooseScalePolicy(both_row, g_sms).vector_width;
  const double t_line = TimeMs([&] { launch(per_line); });
  const double t_pos = TimeMs([&] { launch(per_pos); });
  const double t_row = TimeMs([&] { launch(both_row); });
  const double t_col = TimeMs([&] { launch(both_col); });
  const double t_two = TimeMs([&] {
    launch(per_line);
    launch(tile(nullptr, r, true, c, c));  // in place on C
  });
  Row(name, "kernel, one diagonal per line", t_line, copy, bytes, true);
  Row(name, "kernel, one diagonal per position", t_pos, copy, bytes, true);
  Row(name, "kernel, two-sided, row-major (l per line)", t_row, copy, bytes, true);
  Row(name, "kernel, two-sided, column-major (l per position)", t_col, copy, bytes, true);
  Row(name, "kernel, two one-sided launches", t_two, copy, bytes, false);
  const double two_ratio = std::max(t_row, t_col) / t_two;
  Line("| %s | two-sided / two one-sided (target <= 0.55) | | | %.3f | %s |", name, two_ratio,
       Mark(two_ratio <= 0.55));
  if constexpr (CublasOf<T>::kHas) {
    auto dgmm = [&](const T* in, T* out, const T* d, bool line) {
      CB(cuda::LaunchCublasDgmm(g_blas, cuda::DeviceTile<T>{.in = in, .out = out, .diag = d,
                                                           .lines = n, .line_len = n,
                                                           .per_line = line}));
    };
    const T* lt = reinterpret_cast<const T*>(l);  // same type: K is T
    const T* rt = reinterpret_cast<const T*>(r);
    const double b_line = TimeMs([&] { dgmm(a, c, lt, true); });
    const double b_pos = TimeMs([&] { dgmm(a, c, rt, false); });
    const double b_two = TimeMs([&] {
      dgmm(a, c, lt, true);
      dgmm(c, c, rt, false);
    });
    Row(name, "cuBLAS dgmm, per line (SIDE_RIGHT)", b_line, copy, bytes, false);
    Row(name, "cuBLAS dgmm, per position (SIDE_LEFT)", b_pos, copy, bytes, false);
    Row(name, "cuBLAS dgmm, two-sided as two calls", b_two, copy, bytes, false);
    Line("| %s | kernel two-sided / cuBLAS two calls | | | %.3f | (info) |", name,
         std::max(t_row, t_col) / b_two);
  }
  Line("| %s | (vector width %d) | | | | |", name, vec);
  CK(cudaFree(a));
  CK(cudaFree(c));
  CK(cudaFree(l));
  CK(cudaFree(r));
}

// A promoted pair: A as TA, C as TC. The ceiling is a copy moving as many
// bytes ((in + out) / 2 each way).
template <typename TA, typename TC>
void Promoted(const char* name) {
  using K = Compute<TC>;
  const int64_t n = g_n, elems = n * n;
  const int64_t in_bytes = elems * sizeof(TA), out_bytes = elems * sizeof(TC);
  const int64_t same = (in_bytes + out_bytes) / 2;
  void *a = nullptr, *c = nullptr, *l = nullptr, *r = nullptr;
  CK(cudaMalloc(&a, std::max(in_bytes, same)));
  CK(cudaMalloc(&c, std::max(out_bytes, same)));
  CK(cudaMalloc(&l, n * sizeof(K)));
  CK(cudaMalloc(&r, n * sizeof(K)));
  constexpr bool kDoublesA = std::is_same_v<TA, double> || std::is_same_v<TA, Complex128>;
  constexpr bool kDoublesK = std::is_same_v<K, double> || std::is_same_v<K, Complex128>;
  Fill(a, in_bytes, kDoublesA, 1);
  Fill(l, n * sizeof(K), kDoublesK, 2);
  Fill(r, n * sizeof(K), kDoublesK, 3);
  const double copy = TimeMs([&] { CK(cudaMemcpyAsync(c, a, same, cudaMemcpyDeviceToDevice, g_s)); });
  const cuda::ScaleTile<TA, TC> both{.in = static_cast<const TA*>(a), .out = static_cast<TC*>(c),
                                     .left = static_cast<const K*>(l),
                                     .right = static_cast<const K*>(r), .left_per_line = true,
                                     .lines = n, .line_len = n};
  const cuda::LaunchPolicy chosen = cuda::ChooseScalePolicy(both, g_sms);
  const double t = TimeMs([&] { CK(cuda::LaunchScaleKernel(both, chosen, g_s)); });
  Line("| %s | D2D cudaMemcpy of (in+out)/2 bytes | %.4f | %.0f | 1.000 | |", name, copy,
       2.0 * same / (copy * 1e6));
  Row(name, "kernel, two-sided, row-major", t, copy, same, true);
  // Full vectors two per thread (kFullItems); the same launch at one per
  // thread beside it, for the record. (A tile the vectors do not fit runs
  // scalars, four per thread: nothing to compare.)
  if (chosen.items_per_thread == 2) {
    cuda::LaunchPolicy one = chosen;
    one.items_per_thread = 1;
    one.grid_blocks = 2 * chosen.grid_blocks;  // the same one pass over the tile
    const double t_one = TimeMs([&] { CK(cuda::LaunchScaleKernel(both, one, g_s)); });
    Row(name, "(kernel, one vector per thread instead of two)", t_one, copy, same, false);
  }
  CK(cudaFree(a));
  CK(cudaFree(c));
  CK(cudaFree(l));
  CK(cudaFree(r));
}

}  // namespace
}  // namespace dgmm::bench

int main(int argc, char** argv) {
  using namespace dgmm::bench;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--n=", 0) == 0) {
      g_n = std::atoll(a.c_str() + 4);
    } else if (a.rfind("--reps=", 0) == 0) {
      g_reps = std::atoi(a.c_str() + 7);
    } else if (a == "--only=promoted") {
      g_only_promoted = true;
    } else if (a.rfind("--out=", 0) == 0) {
      out = a.substr(6);
    } else {
      Die("unknown flag " + a + " (flags: --n=N --reps=R --out=FILE.md --only=promoted)");
    }
  }
  if (!out.empty()) g_md = std::fopen(out.c_str(), "w");
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, dev));
  g_sms = p.multiProcessorCount;
  CK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
  CB(cublasCreate(&g_blas));
  CB(cublasSetStream(g_blas, g_s));
  Line("# dtype_bench: N = %lld on %s (%d SMs), median of %d runs after 3 warm-ups\n",
       static_cast<long long>(g_n), p.name, g_sms, g_reps);
  Line("ratio = D2D copy ms / ms (fraction of the copy's bandwidth); GB/s counts bytes read + written.\n");
  Line("| dtype | what | ms | GB/s | ratio | target |");
  Line("|---|---|---:|---:|---:|---|");
  using namespace dgmm;
  if (!g_only_promoted) {
    OneType<Half>("float16");
    OneType<BFloat16>("bfloat16");
    OneType<float>("float32");
    OneType<double>("float64");
    OneType<Complex64>("complex64");
    OneType<Complex128>("complex128");
  }
  Promoted<Half, float>("float16->float32");
  Promoted<Half, double>("float16->float64");
  Promoted<Half, Complex64>("float16->complex64");
  Promoted<Half, Complex128>("float16->complex128");
  Promoted<BFloat16, float>("bfloat16->float32");
  Promoted<BFloat16, double>("bfloat16->float64");
  Promoted<BFloat16, Complex64>("bfloat16->complex64");
  Promoted<BFloat16, Complex128>("bfloat16->complex128");
  Promoted<float, double>("float32->float64");
  Promoted<float, Complex64>("float32->complex64");
  Promoted<float, Complex128>("float32->complex128");
  Promoted<double, Complex128>("float64->complex128");
  Promoted<Complex64, Complex128>("complex64->complex128");
  Line("\n%d MET, %d MISSED", g_met, g_missed);
  if (g_md != nullptr) std::fclose(g_md);
  return 0;
}
