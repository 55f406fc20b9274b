#include "service/backends/cpu/cpu_device.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/core/footprint.h"

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

// Elements [begin, end) of a tile whose first line is `first_line`; `in`
// and `out` point at element `begin`.
template <typename T>
void ScaleRangeTyped(const Problem& p, const T* d, int64_t first_line, const T* in, T* out,
                     int64_t begin, int64_t end) {
  const int64_t len = p.line_len();
  int64_t e = begin;
  while (e < end) {
    const int64_t line = e / len;
    const int64_t pos = e % len;
    const int64_t n = std::min(end - e, len - pos);
    if (p.scale_per_line()) {
      ScaleByScalar<T>(in + (e - begin), out + (e - begin), d[first_line + line], n);
    } else {
      ScaleBySpan<T>(in + (e - begin), out + (e - begin), d + pos, n);
    }
    e += n;
  }
}

// ScaleRange with `in` and `out` pointing at element `begin`.
void ScaleRangeAt(const Problem& p, const std::byte* diag, int64_t first_line,
                  const std::byte* in, std::byte* out, int64_t begin, int64_t end) {
  if (p.dtype == DType::kFloat32) {
    ScaleRangeTyped<float>(p, reinterpret_cast<const float*>(diag), first_line,
                           reinterpret_cast<const float*>(in), reinterpret_cast<float*>(out),
                           begin, end);
  } else {
    ScaleRangeTyped<double>(p, reinterpret_cast<const double*>(diag), first_line,
                            reinterpret_cast<const double*>(in), reinterpret_cast<double*>(out),
                            begin, end);
  }
}

// The loops of ScaleElements, one per form. K is the compute type; Widen and
// Narrow are exact widening and the one rounding to the storage type.
template <typename TA, typename TC>
__attribute__((target_clones("avx512f", "avx2", "default"))) void ScaleLineT(
    const TA* in, TC* out, Compute<TC> s, int64_t n) {
  using K = Compute<TC>;
  for (int64_t i = 0; i < n; ++i) out[i] = Narrow<TC>::From(Mul(s, Widen<K>::From(in[i])));
}

template <typename TA, typename TC>
__attribute__((target_clones("avx512f", "avx2", "default"))) void ScalePosT(
    const TA* in, TC* out, const Compute<TC>* d, int64_t n) {
  using K = Compute<TC>;
  for (int64_t i = 0; i < n; ++i) out[i] = Narrow<TC>::From(Mul(d[i], Widen<K>::From(in[i])));
}

// Two-sided, left scale per line: out = (l · a) · r[i].
template <typename TA, typename TC>
__attribute__((target_clones("avx512f", "avx2", "default"))) void ScaleLinePosT(
    const TA* in, TC* out, Compute<TC> l, const Compute<TC>* r, int64_t n) {
  using K = Compute<TC>;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = Narrow<TC>::From(Mul(Mul(l, Widen<K>::From(in[i])), r[i]));
  }
}

// Two-sided, left scale per position: out = (l[i] · a) · r.
template <typename TA, typename TC>
__attribute__((target_clones("avx512f", "avx2", "default"))) void ScalePosLineT(
    const TA* in, TC* out, const Compute<TC>* l, Compute<TC> r, int64_t n) {
  using K = Compute<TC>;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = Narrow<TC>::From(Mul(Mul(l[i], Widen<K>::From(in[i])), r));
  }
}

template <typename TA, typename TC>
void ScaleElementsTyped(const ScaleArgs& args, int64_t begin, int64_t end) {
  using K = Compute<TC>;
  const TA* in = reinterpret_cast<const TA*>(args.in);
  TC* out = reinterpret_cast<TC*>(args.out);
  const K* l = reinterpret_cast<const K*>(args.left);
  const K* r = reinterpret_cast<const K*>(args.right);
  const int64_t len = args.line_len;
  int64_t e = begin;
  while (e < end) {
    const int64_t line = args.first_line + e / len;
    const int64_t pos = e % len;
    const int64_t n = std::min(end - e, len - pos);
    if (l != nullptr && r != nullptr) {
      if (args.left_per_line) {
        ScaleLinePosT<TA, TC>(in + e, out + e, l[line], r + pos, n);
      } else {
        ScalePosLineT<TA, TC>(in + e, out + e, l + pos, r[line], n);
      }
    } else {
      const K* d = l != nullptr ? l : r;
      const bool per_line = l != nullptr ? args.left_per_line : !args.left_per_line;
      if (per_line) {
        ScaleLineT<TA, TC>(in + e, out + e, d[line], n);
      } else {
        ScalePosT<TA, TC>(in + e, out + e, d + pos, n);
      }
    }
    e += n;
  }
}

// Calls f(TA{}, TC{}) for the pair of storage types, false when the pair is
// not one KernelSupports.
template <typename TC, typename F>
bool WithIn(Scalar in, F&& f) {
  constexpr Scalar c = ScalarOf<TC>::value;
  if (!KernelSupports(in, c)) return false;
  switch (in) {
    case Scalar::kFloat16:
      if constexpr (KernelSupports(Scalar::kFloat16, c)) return f(Half{}, TC{});
      break;
    case Scalar::kBFloat16:
      if constexpr (KernelSupports(Scalar::kBFloat16, c)) return f(BFloat16{}, TC{});
      break;
    case Scalar::kFloat32:
      if constexpr (KernelSupports(Scalar::kFloat32, c)) return f(float{}, TC{});
      break;
    case Scalar::kFloat64:
      if constexpr (KernelSupports(Scalar::kFloat64, c)) return f(double{}, TC{});
      break;
    case Scalar::kComplex64:
      if constexpr (KernelSupports(Scalar::kComplex64, c)) return f(Complex64{}, TC{});
      break;
    case Scalar::kComplex128:
      if constexpr (KernelSupports(Scalar::kComplex128, c)) return f(Complex128{}, TC{});
      break;
  }
  return false;
}

template <typename F>
bool WithTypes(Scalar in, Scalar out, F&& f) {
  switch (out) {
    case Scalar::kFloat16: return WithIn<Half>(in, f);
    case Scalar::kBFloat16: return WithIn<BFloat16>(in, f);
    case Scalar::kFloat32: return WithIn<float>(in, f);
    case Scalar::kFloat64: return WithIn<double>(in, f);
    case Scalar::kComplex64: return WithIn<Complex64>(in, f);
    case Scalar::kComplex128: return WithIn<Complex128>(in, f);
  }
  return false;
}

// Elements [begin, end) of a tile of `p` whose first line is `first_line`,
// with `in` and `out` pointing at element `begin`; `diag` holds the
// prepared diagonals (Problem::prepared_diag_bytes). Plain jobs take the
// float32/float64 loops of ScaleRange, the others ScaleElements.
void ScaleAnyAt(const Problem& p, const std::byte* diag, int64_t first_line, const std::byte* in,
                std::byte* out, int64_t begin, int64_t end) {
  if (p.plain()) {
    ScaleRangeAt(p, diag, first_line, in, out, begin, end);
    return;
  }
  const int64_t in_at = begin * static_cast<int64_t>(p.elem_size());
  const int64_t out_at = begin * static_cast<int64_t>(p.out_elem_size());
  ScaleArgs args;
  args.in_type = p.dtype;
  args.out_type = p.out_dtype();
  // ScaleElements indexes from the tile's first element.
  args.in = in - in_at;
  args.out = out - out_at;
  args.left = p.has_left() ? diag : nullptr;
  args.right = p.two_sided() ? diag + p.right_diag_offset() : p.has_right() ? diag : nullptr;
  args.left_per_line = p.left_per_line();
  args.first_line = first_line;
  args.line_len = p.line_len();
  ScaleElements(args, begin, end);
}

class CpuJob : public JobContext {
 public:
  // `diag`: the prepared diagonals (Device::Begin).
  CpuJob(const Problem& p, const std::byte* diag, ThreadPool* pool)
      : problem_(p), diag_(diag, diag + p.prepared_diag_bytes()), pool_(pool) {}

  absl::Status Process(const Tile& tile, const CancelFn& cancelled, StageTimes* times) override {
    if (cancelled && cancelled()) return absl::CancelledError("job cancelled");
    const absl::Time start = absl::Now();
    const int64_t n = tile.lines * problem_.line_len();
    if (tile.memory != nullptr) return ProcessThrough(tile, n, cancelled, start, times);
    const int64_t in_elem = static_cast<int64_t>(problem_.elem_size());
    const int64_t out_elem = static_cast<int64_t>(problem_.out_elem_size());
    // A cancelled job stops within a grain per thread (a region job is one
    // tile of the whole matrix).
    std::atomic<bool> stopped{false};
    pool_->ParallelFor(n, kGrainElements, [&](int64_t b, int64_t e) {
      for (int64_t at = b; at < e; at += kGrainElements) {
        if (stopped.load(std::memory_order_relaxed)) return;
        if (cancelled && cancelled()) {
          stopped.store(true);
          return;
        }
        const int64_t end = std::min(e, at + kGrainElements);
        ScaleAnyAt(problem_, diag_.data(), tile.first_line, tile.in + at * in_elem,
                   tile.out + at * out_elem, at, end);
      }
    });
    if (times != nullptr) times->compute += absl::Now() - start;
    if (stopped.load()) return absl::CancelledError("job cancelled");
    return absl::OkStatus();
  }

  // A tile in another process's memory: each thread reads a cache-sized
  // piece into a buffer of its own, scales it there and writes it out, so A
  // and C cross memory once each, as in place.
  absl::Status ProcessThrough(const Tile& tile, int64_t n, const CancelFn& cancelled,
                              absl::Time start, StageTimes* times) {
    // In place in one buffer when C has A's element size; a wider C is
    // computed into a second buffer of its own.
    const int64_t elem = static_cast<int64_t>(problem_.elem_size());
    const int64_t out_elem = static_cast<int64_t>(problem_.out_elem_size());
    const bool wider = out_elem != elem;
    std::mutex mu;
    absl::Status first;
    std::atomic<bool> failed{false};
    pool_->ParallelFor(n, kGrainElements, [&](int64_t b, int64_t e) {
      const int64_t most = std::min(e - b, kGrainElements);
      std::vector<std::byte> buffer(static_cast<size_t>(most * elem));
      std::vector<std::byte> result(wider ? static_cast<size_t>(most * out_elem) : 0);
      std::byte* out = wider ? result.data() : buffer.data();
      for (int64_t at = b; at < e && !failed.load(std::memory_order_relaxed); at += kGrainElements) {
        const int64_t count = std::min(e - at, kGrainElements);
        absl::Status s = tile.memory->Read(buffer.data(), tile.in + at * elem, count * elem);
        if (s.ok()) {
          ScaleAnyAt(problem_, diag_.data(), tile.first_line, buffer.data(), out, at, at + count);
          s = tile.memory->Write(tile.out + at * out_elem, out, count * out_elem);
        }
        if (s.ok() && cancelled && cancelled()) s = absl::CancelledError("job cancelled");
        if (!s.ok()) {
          std::lock_guard lock(mu);
          if (first.ok()) first = s;
          failed.store(true);
        }
      }
    });
    if (times != nullptr) times->compute += absl::Now() - start;
    return first;
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
  const int64_t at = begin * static_cast<int64_t>(p.elem_size());
  ScaleRangeAt(p, diag, tile.first_line, tile.in + at, tile.out + at, begin, end);
}

bool ScaleElements(const ScaleArgs& args, int64_t begin, int64_t end) {
  if (args.line_len <= 0 || (args.left == nullptr && args.right == nullptr)) return false;
  return WithTypes(args.in_type, args.out_type, [&](auto a, auto c) {
    ScaleElementsTyped<decltype(a), decltype(c)>(args, begin, end);
    return true;
  });
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
