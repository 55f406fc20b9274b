// The CPU backend against an independent float64 reference on fresh random
// data, with outputs poisoned (NaN) beforehand so unwritten elements show.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/backends/cpu/cpu_device.h"

namespace dgmm {
namespace {

struct Case {
  int64_t rows, cols;
  DType dtype;
  Layout layout;
  Side side;
};

std::string Name(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.cols) + "_" +
         std::string(DTypeName(c.dtype)) + "_" +
         (c.layout == Layout::kRowMajor ? "row" : "col") + "_" + std::string(SideName(c.side));
}

// Element (i, j) of a matrix stored in `layout`.
int64_t Offset(const Case& c, int64_t i, int64_t j) {
  return c.layout == Layout::kRowMajor ? i * c.cols + j : j * c.rows + i;
}

template <typename T>
void RunCase(const Case& c, int64_t tile_lines, bool in_place) {
  SCOPED_TRACE(Name(c) + (in_place ? " in-place" : "") + " tile_lines=" +
               std::to_string(tile_lines));
  std::mt19937_64 rng(std::hash<std::string>{}(Name(c)) ^ static_cast<uint64_t>(tile_lines));
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  const int64_t n = c.rows * c.cols;
  const int64_t dn = c.side == Side::kRight ? c.cols : c.rows;
  std::vector<T> a(n), d(dn);
  for (auto& x : a) x = static_cast<T>(dist(rng));
  for (auto& x : d) x = static_cast<T>(dist(rng));
  std::vector<T> out(n, std::numeric_limits<T>::quiet_NaN());
  if (in_place) out = a;

  CpuDevice cpu(3);
  Problem p{c.rows, c.cols, c.dtype, c.layout, c.side};
  auto job = cpu.Begin(p, BackendKind::kCpu, reinterpret_cast<const std::byte*>(d.data()),
                       JobMode::kWhole, 0);
  ASSERT_TRUE(job.ok()) << job.status();
  StageTimes times;
  const int64_t line = p.line_len();
  for (int64_t first = 0; first < p.lines(); first += tile_lines) {
    const int64_t lines = std::min(tile_lines, p.lines() - first);
    Tile t{reinterpret_cast<const std::byte*>((in_place ? out.data() : a.data()) + first * line),
           reinterpret_cast<std::byte*>(out.data() + first * line), first, lines};
    ASSERT_TRUE((*job)->Process(t, nullptr, &times).ok());
  }

  // float64 reference computed from the definition, not from the backend's
  // normalized form.
  double max_rel = 0;
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t j = 0; j < c.cols; ++j) {
      const double s = static_cast<double>(d[c.side == Side::kRight ? j : i]);
      const double want = static_cast<double>(a[Offset(c, i, j)]) * s;
      const double got = static_cast<double>(out[Offset(c, i, j)]);
      ASSERT_FALSE(std::isnan(got)) << "element (" << i << "," << j << ") was not written";
      max_rel = std::max(max_rel, std::abs(got - want) / std::max(std::abs(want), 1e-30));
    }
  }
  // One rounding of the product in T.
  EXPECT_LE(max_rel, std::numeric_limits<T>::epsilon());
}

class CpuBackendMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(CpuBackendMatrix, MatchesFloat64ReferenceWholeTiledAndInPlace) {
  const Case c = GetParam();
  const int64_t lines = c.layout == Layout::kRowMajor ? c.rows : c.cols;
  for (int64_t tile : {lines, int64_t{1}, std::max<int64_t>(1, lines / 3 + 1)}) {
    if (c.dtype == DType::kFloat32) {
      RunCase<float>(c, tile, false);
      RunCase<float>(c, tile, true);
    } else {
      RunCase<double>(c, tile, false);
      RunCase<double>(c, tile, true);
    }
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {1, 777}, {777, 1}, {33, 65}, {300, 217}};
  for (auto [r, c] : shapes) {
    for (DType t : {DType::kFloat32, DType::kFloat64}) {
      for (Layout l : {Layout::kRowMajor, Layout::kColMajor}) {
        for (Side s : {Side::kRight, Side::kLeft}) cases.push_back({r, c, t, l, s});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuBackendMatrix, ::testing::ValuesIn(AllCases()),
                         [](const auto& info) { return Name(info.param); });

TEST(CpuBackend, LargeMatrixUsesEveryWorkerAndStaysCorrect) {
  // Above the parallel grain: exercises the split across threads.
  RunCase<float>({1500, 1300, DType::kFloat32, Layout::kRowMajor, Side::kRight}, 1500, false);
  RunCase<double>({1300, 1500, DType::kFloat64, Layout::kColMajor, Side::kLeft}, 1500, false);
}

TEST(CpuBackend, FootprintOfWholeJobIsTwoMatricesPlusDiagonalAndStreamedIsFixed) {
  CpuDevice cpu(1);
  Problem p{1000, 2000, DType::kFloat32, Layout::kRowMajor, Side::kRight};
  EXPECT_EQ(cpu.Footprint(p, JobMode::kWhole, 1 << 20), 2 * 1000 * 2000 * 4 + 2000 * 4);
  Problem big = p;
  big.rows = 100000;
  EXPECT_EQ(cpu.Footprint(p, JobMode::kStreamed, 1 << 20),
            cpu.Footprint(big, JobMode::kStreamed, 1 << 20));
}

TEST(CpuBackend, CancelledJobStopsWithCancelled) {
  CpuDevice cpu(1);
  Problem p{4, 4, DType::kFloat32, Layout::kRowMajor, Side::kRight};
  std::vector<float> a(16, 1.0f), d(4, 2.0f), out(16);
  auto job = cpu.Begin(p, BackendKind::kCpu, reinterpret_cast<const std::byte*>(d.data()),
                       JobMode::kWhole, 0);
  ASSERT_TRUE(job.ok());
  Tile t{reinterpret_cast<const std::byte*>(a.data()), reinterpret_cast<std::byte*>(out.data()),
         0, 4};
  EXPECT_EQ((*job)->Process(t, [] { return true; }, nullptr).code(),
            absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace dgmm
