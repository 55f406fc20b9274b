#include "cli/reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

namespace dgmm::cli {
namespace {

using Z = std::complex<double>;

// binary16 and bfloat16 patterns decoded from their formats.
double DecodeHalf(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
  if (e == 31) return m != 0 ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}
double DecodeBFloat16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Element i of an array of `dtype`, as a complex128 (imaginary part 0 for
// the real types).
Z Load(v1::DType dtype, const void* data, int64_t i) {
  const char* p = static_cast<const char*>(data);
  switch (dtype) {
    case v1::DTYPE_FLOAT16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return DecodeHalf(h);
    }
    case v1::DTYPE_BFLOAT16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return DecodeBFloat16(h);
    }
    case v1::DTYPE_FLOAT32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case v1::DTYPE_FLOAT64: {
      double f;
      std::memcpy(&f, p + 8 * i, 8);
      return f;
    }
    case v1::DTYPE_COMPLEX64: {
      float f[2];
      std::memcpy(f, p + 8 * i, 8);
      return Z(f[0], f[1]);
    }
    case v1::DTYPE_COMPLEX128: {
      double f[2];
      std::memcpy(f, p + 16 * i, 16);
      return Z(f[0], f[1]);
    }
    default:
      return Z(std::numeric_limits<double>::quiet_NaN(), 0);
  }
}

bool IsComplex(v1::DType t) { return t == v1::DTYPE_COMPLEX64 || t == v1::DTYPE_COMPLEX128; }

// Runs body(begin, end) over [0, count) in contiguous parts, one per core
// (in this thread when there is little to do).
void ParallelFor(int64_t count, int64_t min_per_thread,
                 const std::function<void(int64_t, int64_t)>& body) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t parts = std::clamp<int64_t>(count / std::max<int64_t>(min_per_thread, 1), 1, cores);
  if (parts == 1) {
    body(0, count);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(parts));
  for (int64_t t = 0; t < parts; ++t) {
    threads.emplace_back(body, count * t / parts, count * (t + 1) / parts);
  }
  for (std::thread& th : threads) th.join();
}

// SplitMix64's finalizer: independent seeds for the pieces of one array.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// SplitMix64 as a stream: a 64-bit state stepped by the golden ratio and
// finalized; fast (a few multiplies a value) and plenty for test data.
struct SplitMix {
  uint64_t state;
  uint64_t operator()() { return Mix(state += 0x9e3779b97f4a7c15ULL); }
  // Uniform in [0.5, 2): 53 random bits scaled.
  double Uniform() { return 0.5 + 1.5 * static_cast<double>((*this)() >> 11) * 0x1.0p-53; }
};

void FillPiece(v1::DType dtype, char* p, int64_t count, SplitMix* rng) {
  for (int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case v1::DTYPE_FLOAT16: {
        // [0.5, 2): exponents -1 and 0, every significand.
        const uint16_t h = static_cast<uint16_t>(0x3800 + (*rng)() % 0x800);
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case v1::DTYPE_BFLOAT16: {
        const uint16_t b = static_cast<uint16_t>(0x3f00 + (*rng)() % 0x100);
        std::memcpy(p + 2 * i, &b, 2);
        break;
      }
      case v1::DTYPE_FLOAT32: {
        // Rounded to float32, a value just under 2 may round to 2: kept below.
        const float f = std::min(static_cast<float>(rng->Uniform()), 0x1.fffffep0f);
        std::memcpy(p + 4 * i, &f, 4);
        break;
      }
      case v1::DTYPE_FLOAT64: {
        const double f = rng->Uniform();
        std::memcpy(p + 8 * i, &f, 8);
        break;
      }
      case v1::DTYPE_COMPLEX64: {
        const float f[2] = {std::min(static_cast<float>(rng->Uniform()), 0x1.fffffep0f),
                            std::min(static_cast<float>(rng->Uniform()), 0x1.fffffep0f)};
        std::memcpy(p + 8 * i, f, 8);
        break;
      }
      case v1::DTYPE_COMPLEX128: {
        const double f[2] = {rng->Uniform(), rng->Uniform()};
        std::memcpy(p + 16 * i, f, 16);
        break;
      }
      default:
        return;
    }
  }
}

// The worst relative error over lines [first, last), the reference computed
// in T: double for a real job (real A, diagonals and result), complex128
// otherwise. `load` reads element i of an array of a dtype as a T.
template <typename T, typename Load>
double Worst(const Job& job, const void* result, int64_t first, int64_t last, Load load) {
  const MatrixView& m = job.matrix;
  const v1::DType d_type =
      job.diagonal_dtype == v1::DTYPE_UNSPECIFIED ? m.dtype : job.diagonal_dtype;
  const v1::DType c_type = ResultDType(job);
  const bool col_major = m.layout == v1::LAYOUT_COL_MAJOR;
  const int64_t line_length = col_major ? m.rows : m.cols;
  double worst = 0;
  for (int64_t line = first; line < last; ++line) {
    for (int64_t k = 0; k < line_length; ++k) {
      const int64_t row = col_major ? k : line;
      const int64_t col = col_major ? line : k;
      const int64_t index = line * line_length + k;
      T reference = load(m.dtype, m.data, index);
      if (job.side == v1::SIDE_BOTH) {
        reference = load(d_type, job.diagonal, row) * reference *
                    load(d_type, job.right_diagonal, col);
      } else {
        reference *= load(d_type, job.diagonal, job.side == v1::SIDE_LEFT ? row : col);
      }
      const double error = std::abs(load(c_type, result, index) - reference);
      const double relative = reference != T(0) ? error / std::abs(reference) : error;
      if (!(relative <= worst)) {
        worst = std::isnan(relative) ? std::numeric_limits<double>::infinity() : relative;
      }
    }
  }
  return worst;
}

// Lines [first, last), either kind of job.
double WorstOf(const Job& job, const void* result, int64_t first, int64_t last) {
  const v1::DType d_type =
      job.diagonal_dtype == v1::DTYPE_UNSPECIFIED ? job.matrix.dtype : job.diagonal_dtype;
  if (IsComplex(job.matrix.dtype) || IsComplex(d_type)) {
    return Worst<Z>(job, result, first, last, Load);
  }
  // Real: the common dtypes read directly, the rest through Load; real
  // arithmetic, so that an infinity times a real stays what it is.
  return Worst<double>(job, result, first, last, [](v1::DType t, const void* data, int64_t i) {
    if (t == v1::DTYPE_FLOAT32) return static_cast<double>(static_cast<const float*>(data)[i]);
    if (t == v1::DTYPE_FLOAT64) return static_cast<const double*>(data)[i];
    return Load(t, data, i).real();
  });
}

}  // namespace

void FillUniform(v1::DType dtype, void* data, int64_t count, uint64_t seed) {
  constexpr int64_t kPiece = int64_t{1} << 16;  // elements drawn from one generator
  const int64_t pieces = (count + kPiece - 1) / kPiece;
  const size_t elem = dtype == v1::DTYPE_FLOAT16 || dtype == v1::DTYPE_BFLOAT16 ? 2
                      : dtype == v1::DTYPE_FLOAT32                             ? 4
                      : dtype == v1::DTYPE_COMPLEX128                          ? 16
                                                                               : 8;
  char* p = static_cast<char*>(data);
  ParallelFor(pieces, 4, [&](int64_t first, int64_t last) {
    for (int64_t piece = first; piece < last; ++piece) {
      SplitMix rng{Mix(seed ^ Mix(static_cast<uint64_t>(piece)))};
      const int64_t begin = piece * kPiece;
      FillPiece(dtype, p + static_cast<size_t>(begin) * elem, std::min(kPiece, count - begin),
                &rng);
    }
  });
}

double MaxRelativeError(const Job& job, const void* result) {
  const MatrixView& m = job.matrix;
  const int64_t lines = m.layout == v1::LAYOUT_COL_MAJOR ? m.cols : m.rows;
  const int64_t line_length = m.layout == v1::LAYOUT_COL_MAJOR ? m.rows : m.cols;
  std::vector<double> worst(std::max<size_t>(1, std::thread::hardware_concurrency()), 0.0);
  std::atomic<size_t> next{0};
  ParallelFor(lines, std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(line_length, 1)),
              [&](int64_t first, int64_t last) {
                const double w = WorstOf(job, result, first, last);
                worst[next.fetch_add(1)] = w;
              });
  double all = 0;
  for (double w : worst) all = std::max(all, w);  // NaN never gets here: WorstOf maps it
  return all;
}

double DefaultTolerance(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
      return 2e-3;  // 2^-11 per rounding
    case v1::DTYPE_BFLOAT16:
      return 1.6e-2;  // 2^-8 per rounding
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_COMPLEX64:
      return 1e-6;
    default:
      return 1e-14;
  }
}

}  // namespace dgmm::cli
