#include "cli/reference.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>

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

// a·b: the real product for real operands (so that an infinity times a real
// stays what it is), the complex one otherwise.
Z Mul(Z a, Z b, bool complex) { return complex ? a * b : Z(a.real() * b.real(), 0); }

}  // namespace

void FillUniform(v1::DType dtype, void* data, int64_t count, std::mt19937_64* rng) {
  std::uniform_real_distribution<double> uniform(0.5, 2.0);
  char* p = static_cast<char*>(data);
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
        const float f = static_cast<float>(uniform(*rng));
        std::memcpy(p + 4 * i, &f, 4);
        break;
      }
      case v1::DTYPE_FLOAT64: {
        const double f = uniform(*rng);
        std::memcpy(p + 8 * i, &f, 8);
        break;
      }
      case v1::DTYPE_COMPLEX64: {
        const float f[2] = {static_cast<float>(uniform(*rng)), static_cast<float>(uniform(*rng))};
        std::memcpy(p + 8 * i, f, 8);
        break;
      }
      case v1::DTYPE_COMPLEX128: {
        const double f[2] = {uniform(*rng), uniform(*rng)};
        std::memcpy(p + 16 * i, f, 16);
        break;
      }
      default:
        return;
    }
  }
}

double MaxRelativeError(const Job& job, const void* result) {
  const MatrixView& m = job.matrix;
  const v1::DType d_type =
      job.diagonal_dtype == v1::DTYPE_UNSPECIFIED ? m.dtype : job.diagonal_dtype;
  const bool complex = IsComplex(m.dtype) || IsComplex(d_type);
  const v1::DType c_type = ResultDType(job);
  const bool col_major = m.layout == v1::LAYOUT_COL_MAJOR;
  const int64_t lines = col_major ? m.cols : m.rows;
  const int64_t line_length = col_major ? m.rows : m.cols;
  double worst = 0;
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t k = 0; k < line_length; ++k) {
      const int64_t row = col_major ? k : line;
      const int64_t col = col_major ? line : k;
      const int64_t index = line * line_length + k;
      Z reference = Load(m.dtype, m.data, index);
      if (job.side == v1::SIDE_BOTH) {
        reference = Mul(Mul(Load(d_type, job.diagonal, row), reference, complex),
                        Load(d_type, job.right_diagonal, col), complex);
      } else {
        const Z scale = Load(d_type, job.diagonal, job.side == v1::SIDE_LEFT ? row : col);
        reference = Mul(scale, reference, complex);
      }
      const double error = std::abs(Load(c_type, result, index) - reference);
      const double relative = reference != Z(0) ? error / std::abs(reference) : error;
      if (!(relative <= worst)) {
        worst = std::isnan(relative) ? std::numeric_limits<double>::infinity() : relative;
      }
    }
  }
  return worst;
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
