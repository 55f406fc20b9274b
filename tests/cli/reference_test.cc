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
  std::mt19937_64 rng(3);
  std::vector<float> v(10000);
  FillUniform(v1::DTYPE_FLOAT32, v.data(), static_cast<int64_t>(v.size()), &rng);
  for (float x : v) {
    EXPECT_GE(x, 0.5f);
    EXPECT_LE(x, 2.0f);
  }
  EXPECT_EQ(DefaultTolerance(v1::DTYPE_FLOAT32), 1e-6);
  EXPECT_EQ(DefaultTolerance(v1::DTYPE_FLOAT64), 1e-14);
}

}  // namespace
}  // namespace dgmm::cli
