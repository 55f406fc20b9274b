#include "service/backends/cpu/cpu_device.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/engine/footprint.h"

namespace dgmm {
namespace {

// Elements a worker handles at least: below this, threads cost more than
// they save. A job the engine runs on gRPC's callback thread
// (Engine::kRunHereMaxMatrixBytes, 64 KiB: at most 16 Ki elements) is one
// chunk, computed on that thread without waking the pool.
constexpr int64_t kGrainElements = int64_t{1} << 16;

int64_t MemInfoBytes(const char* key) {
  std::ifstream f("/proc/meminfo");
  std::string name;
  int64_t kib = 0;
  std::string unit;
  while (f >> name >> kib >> unit) {
    if (name == key) return kib * 1024;
  }
  return 0;
}

// The inner loops. target_clones builds one copy per instruction set and
// picks the best at load time, so one binary vectorizes with AVX-512 or AVX2
// where the CPU has them and with SSE2 elsewhere.
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void ScaleBySpan(
    const T* in, T* out, const T* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * d[i];
}

template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void ScaleByScalar(
    const T* in, T* out, T s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * s;
}

template <typename T>
void ScaleRangeTyped(const Problem& p, const T* d, const Tile& tile, int64_t begin,
                     int64_t end) {
  const T* in = reinterpret_cast<const T*>(tile.in);
  T* out = reinterpret_cast<T*>(tile.out);
  const int64_t len = p.line_len();
  int64_t e = begin;
  while (e < end) {
    const int64_t line = e / len;
    const int64_t pos = e % len;
    const int64_t n = std::min(end - e, len - pos);
    if (p.scale_per_line()) {
      ScaleByScalar<T>(in + e, out + e, d[tile.first_line + line], n);
    } else {
      ScaleBySpan<T>(in + e, out + e, d + pos, n);
    }
    e += n;
  }
}

class CpuJob : public JobContext {
 public:
  CpuJob(const Problem& p, const std::byte* diag, ThreadPool* pool)
      : problem_(p), diag_(diag, diag + p.diag_bytes()), pool_(pool) {}

  absl::Status Process(const Tile& tile, const CancelFn& cancelled,
                       StageTimes* times) override {
    if (cancelled && cancelled()) return absl::CancelledError("job cancelled");
    const absl::Time start = absl::Now();
    const int64_t n = tile.lines * problem_.line_len();
    pool_->ParallelFor(n, kGrainElements, [&](int64_t b, int64_t e) {
      ScaleRange(problem_, diag_.data(), tile, b, e);
    });
    if (times != nullptr) times->compute += absl::Now() - start;
    return absl::OkStatus();
  }

 private:
  Problem problem_;
  // Own copy, aligned for the element type by std::vector<std::byte>'s
  // allocator (operator new aligns to at least 16 bytes).
  std::vector<std::byte> diag_;
  ThreadPool* pool_;
};

}  // namespace

void ScaleRange(const Problem& p, const std::byte* diag, const Tile& tile,
                int64_t begin, int64_t end) {
  if (p.dtype == DType::kFloat32) {
    ScaleRangeTyped<float>(p, reinterpret_cast<const float*>(diag), tile, begin, end);
  } else {
    ScaleRangeTyped<double>(p, reinterpret_cast<const double*>(diag), tile, begin, end);
  }
}

CpuDevice::CpuDevice(int threads)
    : pool_(threads > 0 ? threads
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      total_memory_(MemInfoBytes("MemTotal:")),
      free_at_start_(MemInfoBytes("MemAvailable:")) {}

std::string CpuDevice::name() const {
  return absl::StrCat("cpu (", pool_.size(), " threads)");
}

int64_t CpuDevice::Footprint(const Problem& p, JobMode mode,
                             int64_t max_block_bytes) const {
  // A CPU job computes in its host block buffers: its device memory is its
  // host footprint.
  return HostFootprint(p, mode, max_block_bytes);
}

absl::StatusOr<std::unique_ptr<JobContext>> CpuDevice::Begin(
    const Problem& p, BackendKind backend, const std::byte* diag, JobMode mode,
    int64_t max_block_bytes) {
  if (backend != BackendKind::kCpu) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CPU device cannot run backend ", BackendName(backend)));
  }
  return std::unique_ptr<JobContext>(new CpuJob(p, diag, &pool_));
}

}  // namespace dgmm
