#include "cli/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dgmm::cli {
namespace {

template <typename T>
void Fill(T* data, int64_t count, std::mt19937_64* rng) {
  std::uniform_real_distribution<double> uniform(0.5, 2.0);
  for (int64_t i = 0; i < count; ++i) data[i] = static_cast<T>(uniform(*rng));
}

template <typename T>
double MaxError(const Job& job, const T* a, const T* d, const T* c) {
  const MatrixView& m = job.matrix;
  const bool col_major = m.layout == v1::LAYOUT_COL_MAJOR;
  const int64_t lines = col_major ? m.cols : m.rows;
  const int64_t line_length = col_major ? m.rows : m.cols;
  double worst = 0;
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t k = 0; k < line_length; ++k) {
      const int64_t row = col_major ? k : line;
      const int64_t col = col_major ? line : k;
      const int64_t index = line * line_length + k;
      const double scale = static_cast<double>(d[job.side == v1::SIDE_LEFT ? row : col]);
      const double reference = static_cast<double>(a[index]) * scale;
      const double error = std::fabs(static_cast<double>(c[index]) - reference);
      const double relative = reference != 0 ? error / std::fabs(reference) : error;
      if (!(relative <= worst)) {
        worst = std::isnan(relative) ? std::numeric_limits<double>::infinity() : relative;
      }
    }
  }
  return worst;
}

}  // namespace

void FillUniform(v1::DType dtype, void* data, int64_t count, std::mt19937_64* rng) {
  if (dtype == v1::DTYPE_FLOAT32) {
    Fill(static_cast<float*>(data), count, rng);
  } else {
    Fill(static_cast<double*>(data), count, rng);
  }
}

double MaxRelativeError(const Job& job, const void* result) {
  if (job.matrix.dtype == v1::DTYPE_FLOAT32) {
    return MaxError(job, static_cast<const float*>(job.matrix.data),
                    static_cast<const float*>(job.diagonal), static_cast<const float*>(result));
  }
  return MaxError(job, static_cast<const double*>(job.matrix.data),
                  static_cast<const double*>(job.diagonal), static_cast<const double*>(result));
}

double DefaultTolerance(v1::DType dtype) { return dtype == v1::DTYPE_FLOAT32 ? 1e-6 : 1e-14; }

}  // namespace dgmm::cli
