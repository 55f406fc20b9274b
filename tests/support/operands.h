// Random operands of a typed dgmm::Job and an independent float64 check of
// the result, shared by the tests that drive the C++ client.
#ifndef DGMM_TESTS_SUPPORT_OPERANDS_H_
#define DGMM_TESTS_SUPPORT_OPERANDS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "dgmm/client.h"

namespace dgmm::testing {

// Operands of a rows x cols job of element type T, in memory order of `layout`.
template <typename T>
struct Operands {
  int64_t rows, cols;
  v1::Layout layout;
  v1::Side side;
  std::vector<T> a, d;

  Operands(int64_t r, int64_t c, v1::Layout l, v1::Side s, uint64_t seed)
      : rows(r), cols(c), layout(l), side(s) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> uniform(-4.0, 4.0);
    a.resize(static_cast<size_t>(rows * cols));
    for (T& x : a) x = static_cast<T>(uniform(rng));
    d.resize(static_cast<size_t>(side == v1::SIDE_RIGHT ? cols : rows));
    for (T& x : d) x = static_cast<T>(uniform(rng));
  }

  Job MakeJob() const {
    Job job;
    job.matrix = {a.data(), rows, cols, sizeof(T) == 4 ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT64,
                  layout};
    job.diagonal = d.data();
    job.diagonal_bytes = d.size() * sizeof(T);
    job.side = side;
    return job;
  }

  // An output buffer pre-filled with NaN, so unwritten elements show.
  std::vector<T> NanOutput() const {
    return std::vector<T>(a.size(), std::numeric_limits<T>::quiet_NaN());
  }

  // Largest relative difference between `c` and A·diag(d) or diag(d)·A
  // computed in float64; NaN counts as infinite.
  double MaxRelativeError(const std::vector<T>& c) const {
    double worst = 0;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const size_t k =
            static_cast<size_t>(layout == v1::LAYOUT_ROW_MAJOR ? i * cols + j : j * rows + i);
        const double ref =
            static_cast<double>(a[k]) *
            static_cast<double>(d[static_cast<size_t>(side == v1::SIDE_RIGHT ? j : i)]);
        const double err =
            std::fabs(static_cast<double>(c[k]) - ref) / std::max(std::fabs(ref), 1e-300);
        if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
      }
    }
    return worst;
  }
};

}  // namespace dgmm::testing

#endif  // DGMM_TESTS_SUPPORT_OPERANDS_H_
