// The CLI's --check: random operands and the float64 reference comparison.
#include "cli/reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace dgmm::cli {
namespace {

// A 2x3 job; A = [[1 2 3] [4 5 6]] stored in `layout` order.
struct Fixture {
  std::vector<double> a;
  std::vector<double> d;
  Job job;
  Fixture(v1::Layout layout, v1::Side side) {
    a = layout == v1::LAYOUT_ROW_MAJOR ? std::vector<double>{1, 2, 3, 4, 5, 6}
                                       : std::vector<double>{1, 4, 2, 5, 3, 6};
    d = side == v1::SIDE_RIGHT ? std::vector<double>{10, 100, 1000} : std::vector<double>{10, 100};
    job.matrix = {a.data(), 2, 3, v1::DTYPE_FLOAT64, layout};
    job.diagonal = d.data();
    job.diagonal_bytes = d.size() * 8;
    job.side = side;
  }
};

TEST(ReferenceTest, ExactResultHasZeroErrorForEverySideAndLayout) {
  // Expected C in row-major order, then stored in the job's layout.
  const std::vector<double> right = {10, 200, 3000, 40, 500, 6000};
  const std::vector<double> left = {10, 20, 30, 400, 500, 600};
  for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
    for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
      Fixture f(layout, side);
      const std::vector<double>& c = side == v1::SIDE_RIGHT ? right : left;
      std::vector<double> stored = c;
      if (layout == v1::LAYOUT_COL_MAJOR) stored = {c[0], c[3], c[1], c[4], c[2], c[5]};
      EXPECT_EQ(MaxRelativeError(f.job, stored.data()), 0.0) << layout << " " << side;
    }
  }
}

TEST(ReferenceTest, ReportsTheLargestRelativeErrorAndNanAsInfinity) {
  Fixture f(v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT);
  std::vector<double> c = {10, 20, 30, 400, 500, 600};
  c[4] = 500 * (1 + 1e-9);
  EXPECT_NEAR(MaxRelativeError(f.job, c.data()), 1e-9, 1e-15);
  c[1] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(MaxRelativeError(f.job, c.data()), std::numeric_limits<double>::infinity());
}

TEST(ReferenceTest, RandomValuesAreNonZeroAndBelowTwo) {
  std::vector<float> v(10000);
  FillUniform(v1::DTYPE_FLOAT32, v.data(), static_cast<int64_t>(v.size()), 3);
  for (float x : v) {
    EXPECT_GE(x, 0.5f);
    EXPECT_LE(x, 2.0f);
  }
  EXPECT_EQ(DefaultTolerance(v1::DTYPE_FLOAT32), 1e-6);
  EXPECT_EQ(DefaultTolerance(v1::DTYPE_FLOAT64), 1e-14);
}

// Many pieces, drawn on several threads: the values depend on the seed
// alone (the same twice, another seed differs), every element is written,
// and the pieces are not copies of each other.
TEST(ReferenceTest, RandomValuesOfALargeArrayDependOnTheSeedAlone) {
  const size_t n = (size_t{1} << 20) + 12345;  // 16 pieces and a partial one
  const float poison = -1.0f;
  std::vector<float> a(n, poison), b(n, poison), c(n, poison);
  FillUniform(v1::DTYPE_FLOAT32, a.data(), static_cast<int64_t>(n), 7);
  FillUniform(v1::DTYPE_FLOAT32, b.data(), static_cast<int64_t>(n), 7);
  FillUniform(v1::DTYPE_FLOAT32, c.data(), static_cast<int64_t>(n), 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (float x : a) ASSERT_TRUE(x >= 0.5f && x < 2.0f) << x;
  EXPECT_NE(std::vector<float>(a.begin(), a.begin() + 65536),
            std::vector<float>(a.begin() + 65536, a.begin() + 131072));
}

// The check over many lines (several threads): the worst error is found
// wherever it lies, for real and complex jobs.
TEST(ReferenceTest, TheWorstErrorIsFoundInAnyPartOfALargeJob) {
  const int64_t rows = 3001, cols = 257;
  std::vector<double> a(static_cast<size_t>(rows * cols)), d(static_cast<size_t>(cols));
  FillUniform(v1::DTYPE_FLOAT64, a.data(), rows * cols, 1);
  FillUniform(v1::DTYPE_FLOAT64, d.data(), cols, 2);
  Job job;
  job.matrix = {a.data(), rows, cols, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR};
  job.diagonal = d.data();
  job.diagonal_bytes = d.size() * 8;
  job.side = v1::SIDE_RIGHT;
  std::vector<double> c(a.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) c[i * cols + j] = a[i * cols + j] * d[j];
  }
  EXPECT_EQ(MaxRelativeError(job, c.data()), 0.0);
  for (const int64_t at : {int64_t{0}, rows * cols / 2 + 5, rows * cols - 1}) {
    std::vector<double> off = c;
    off[at] *= 1 + 1e-7;
    EXPECT_NEAR(MaxRelativeError(job, off.data()), 1e-7, 1e-12) << at;
    off[at] = std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(MaxRelativeError(job, off.data()), std::numeric_limits<double>::infinity()) << at;
  }
  // Complex128, the same way.
  std::vector<double> za(2 * a.size()), zd(2 * d.size());
  FillUniform(v1::DTYPE_COMPLEX128, za.data(), rows * cols, 3);
  FillUniform(v1::DTYPE_COMPLEX128, zd.data(), cols, 4);
  job.matrix = {za.data(), rows, cols, v1::DTYPE_COMPLEX128, v1::LAYOUT_ROW_MAJOR};
  job.diagonal = zd.data();
  job.diagonal_bytes = zd.size() * 8;
  std::vector<double> zc(za.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const size_t e = static_cast<size_t>(i * cols + j);
      const double ar = za[2 * e], ai = za[2 * e + 1], dr = zd[2 * j], di = zd[2 * j + 1];
      zc[2 * e] = ar * dr - ai * di;
      zc[2 * e + 1] = ar * di + ai * dr;
    }
  }
  EXPECT_LE(MaxRelativeError(job, zc.data()), 1e-15);
  zc[2 * (rows * cols - 3)] *= 1 + 1e-4;  // the real part: a part of the modulus
  EXPECT_GT(MaxRelativeError(job, zc.data()), 1e-6);
}

}  // namespace
}  // namespace dgmm::cli
