// zero_copy_bench: can a job on a pinned host region skip the copy pipeline
// and run as one kernel that reads A from, and writes C to, host memory over
// PCIe (mapped pinned memory, "zero copy")? Issue 25's dgmm.empty target is
// 1.15 x the PCIe duplex floor; the piece pipeline alone is 0.6-1.1 ms over
// it at N = 10000 (bench/results/user_path/h200_timeline_ramp_ec561f3.md).
//
// For each N (float32, N x N, row-major, C = A·diag(d)), host A and C are
// memfd mappings (as a client's region is) registered with cudaHostRegister
// exactly as the server pins regions (cudaHostRegisterPortable), and:
//
//   floor            A host->device on one stream and device->host into C on
//                    another, at once (the duplex floor user_path_bench uses)
//   zero-copy        dgmm's kernel (LaunchDgmmKernel, the server's policy) on
//                    the host pointers themselves
//   zero-copy in place  the same with C = A (a region job in place)
//   policy sweeps    items per thread 1/2/4 and grids capped at k x SMs
//
// Every timing is host wall time (enqueue to synchronize, as a job sees it),
// median of --reps after 3 warm-ups. C is poisoned with NaN before the
// checked run and every element compared with the float64 product rounded
// to float32 (exact for one multiplication).
//
//   zero_copy_bench --n=10000,20000 --reps=15
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "service/backends/cuda/dgmm_kernel.h"

ABSL_FLAG(std::string, n, "10000,20000", "square sizes N, float32");
ABSL_FLAG(int, reps, 15, "timed runs per measurement (after 3 warm-ups); medians");

namespace {

#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// A memfd of `bytes`, mapped shared (a client's region as the server maps it).
float* MapRegion(size_t bytes) {
  const int fd = memfd_create("zero-copy-bench", 0);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::perror("memfd");
    std::exit(1);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return static_cast<float*>(p);
}

// Values in ±[0.5, 2) from a hash of the index: never zero.
void Fill(float* out, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float mag = 0.5f + 1.5f * static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
    out[i] = (x & 1) ? -mag : mag;
  }
}

double MedianMs(int reps, const std::function<void()>& run) {
  for (int i = 0; i < 3; ++i) run();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Mismatches of c against float(a * d[j]) over the whole matrix.
int64_t Check(const float* a, const float* c, const std::vector<float>& d, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float want = static_cast<float>(static_cast<double>(a[i * n + j]) * d[j]);
      if (!(c[i * n + j] == want)) ++bad;
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int reps = absl::GetFlag(FLAGS_reps);
  int sms = 0, host_ptr_ok = 0, uva = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK_CUDA(cudaDeviceGetAttribute(&host_ptr_ok, cudaDevAttrCanUseHostPointerForRegisteredMem, 0));
  CHECK_CUDA(cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, 0));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "# zero_copy_bench: %s, %d SMs, unified addressing %d, "
      "host pointer usable for registered memory %d\n",
      prop.name, sms, uva, host_ptr_ok);
  cudaStream_t s1, s2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_n), ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n <= 0) return 2;
    const size_t elems = static_cast<size_t>(n) * static_cast<size_t>(n);
    const size_t bytes = elems * sizeof(float);
    float* a = MapRegion(bytes);
    float* c = MapRegion(bytes);
    Fill(a, elems, 0x1234 + static_cast<uint64_t>(n));
    std::vector<float> d(static_cast<size_t>(n));
    Fill(d.data(), d.size(), 0x777);
    CHECK_CUDA(cudaHostRegister(a, bytes, cudaHostRegisterPortable));
    CHECK_CUDA(cudaHostRegister(c, bytes, cudaHostRegisterPortable));
    void* a_dev = nullptr;
    CHECK_CUDA(cudaHostGetDevicePointer(&a_dev, a, 0));
    float *da = nullptr, *dc = nullptr, *dd = nullptr;
    CHECK_CUDA(cudaMalloc(&da, bytes));
    CHECK_CUDA(cudaMalloc(&dc, bytes));
    CHECK_CUDA(cudaMalloc(&dd, d.size() * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(dd, d.data(), d.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dc, a, bytes, cudaMemcpyHostToDevice));
    const double gb = 2.0 * static_cast<double>(bytes) / 1e9;  // in + out

    auto floor = [&] {
      CHECK_CUDA(cudaMemcpyAsync(da, a, bytes, cudaMemcpyHostToDevice, s1));
      CHECK_CUDA(cudaMemcpyAsync(c, dc, bytes, cudaMemcpyDeviceToHost, s2));
      CHECK_CUDA(cudaStreamSynchronize(s1));
      CHECK_CUDA(cudaStreamSynchronize(s2));
    };
    const double floor_ms = MedianMs(reps, floor);
    std::printf("\nN=%lld float32 (%.1f MB each way); host pointer %s device pointer\n",
                static_cast<long long>(n), static_cast<double>(bytes) / 1e6,
                a_dev == a ? "==" : "!=");
    std::printf(
        "| run | ms | x floor | GB/s in+out | policy (threads x blocks, items) | wrong |\n");
    std::printf("|---|---|---|---|---|---|\n");
    std::printf("| duplex floor (copies) | %.3f | 1.000 | %.1f | | |\n", floor_ms,
                gb / floor_ms * 1e3);

    auto row = [&](const char* name, float* in, float* out, const dgmm::cuda::LaunchPolicy* pol) {
      dgmm::cuda::DeviceTile<float> tile{
          .in = in, .out = out, .diag = dd, .lines = n, .line_len = n, .per_line = false};
      const dgmm::cuda::LaunchPolicy used =
          pol != nullptr ? *pol : dgmm::cuda::ChooseLaunchPolicy(tile, sms);
      auto run = [&] {
        CHECK_CUDA(dgmm::cuda::LaunchDgmmKernel(tile, used, s1));
        CHECK_CUDA(cudaStreamSynchronize(s1));
      };
      const double ms = MedianMs(reps, run);
      int64_t wrong = -1;
      if (out == c) {  // checked: poison C, one more run, every element
        std::fill(c, c + elems, std::numeric_limits<float>::quiet_NaN());
        run();
        wrong = Check(a, c, d, n);
      }
      std::printf("| %s | %.3f | %.3f | %.1f | %d x %d, %d | %s |\n", name, ms, ms / floor_ms,
                  gb / ms * 1e3, used.block_threads, used.grid_blocks, used.items_per_thread,
                  wrong < 0 ? "(not checked)" : std::to_string(wrong).c_str());
    };
    row("zero-copy, server policy", a, c, nullptr);
    {
      dgmm::cuda::DeviceTile<float> tile{
          .in = a, .out = c, .diag = dd, .lines = n, .line_len = n, .per_line = false};
      const dgmm::cuda::LaunchPolicy base = dgmm::cuda::ChooseLaunchPolicy(tile, sms);
      for (int items : {1, 2, 4}) {
        for (int per_sm : {1, 2, 4, 8, 16}) {
          dgmm::cuda::LaunchPolicy p = base;
          p.items_per_thread = items;
          const int64_t vectors = static_cast<int64_t>(elems) / p.vector_width;
          const int64_t needed =
              (vectors + int64_t{p.block_threads} * items - 1) / (int64_t{p.block_threads} * items);
          p.grid_blocks = static_cast<int>(std::min<int64_t>(needed, int64_t{sms} * per_sm));
          char name[64];
          std::snprintf(name, sizeof(name), "zero-copy, %d items, <= %d blocks/SM", items, per_sm);
          row(name, a, c, &p);
        }
      }
    }
    row("zero-copy in place (C = A)", a, a, nullptr);
    // Device-resident kernel for scale: the same launch on device memory.
    row("kernel on device memory (reference)", da, dc, nullptr);
    // Leaves a's contents scaled by the in-place rows; nothing reads it after.
    CHECK_CUDA(cudaHostUnregister(a));
    CHECK_CUDA(cudaHostUnregister(c));
    cudaFree(da);
    cudaFree(dc);
    cudaFree(dd);
    munmap(a, bytes);
    munmap(c, bytes);
  }
  return 0;
}
