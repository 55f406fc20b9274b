// The CPU job (CpuDevice::Begin, CpuJob::Process) for every element type, a
// promoted diagonal and two-sided scaling, as the engine runs it:
// the diagonals prepared by PrepareDiagonals, tiles of a few lines (the
// stream's blocks), in place (the unary and stream buffers), and in another
// process's memory through TileMemory (CpuJob::ProcessThrough, in pieces of
// the pool's grain). Outputs are poisoned; every element is compared bit for
// bit (any NaN equals any NaN) with tests/support/dtype_reference.h.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "service/backends/cpu/cpu_device.h"
#include "tests/support/dtype_reference.h"

namespace dgmm {
namespace {

// "Another process's memory": plain copies, counted.
class CopyingMemory : public TileMemory {
 public:
  absl::Status Read(std::byte* dst, const std::byte* src, int64_t bytes) const override {
    reads_.fetch_add(1);
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status Write(std::byte* dst, const std::byte* src, int64_t bytes) const override {
    writes_.fetch_add(1);
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  int reads() const { return reads_.load(); }
  int writes() const { return writes_.load(); }

 private:
  mutable std::atomic<int> reads_{0}, writes_{0};
};

enum class How { kTiles, kInPlace, kThrough };

// A job of TA with diagonals of TD and C of TC (A's dtype, or a wider
// promoted one) run `how`; "" or the first mismatches.
template <typename TA, typename TD, typename TC = TA>
std::string Run(int64_t rows, int64_t cols, Layout layout, Side side, How how, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t n = rows * cols;
  std::vector<TA> a(static_cast<size_t>(n));
  for (auto& x : a) x = ref::Value<TA>(rng);
  std::vector<TD> l(static_cast<size_t>(side == Side::kRight ? cols : rows));
  std::vector<TD> r(static_cast<size_t>(side == Side::kBoth ? cols : 0));
  for (auto& x : l) x = ref::Value<TD>(rng);
  for (auto& x : r) x = ref::Value<TD>(rng);
  std::vector<TC> out(a.size());
  std::memset(static_cast<void*>(out.data()), 0xff, out.size() * sizeof(TC));  // NaN
  if constexpr (std::is_same_v<TA, TC>) {
    if (how == How::kInPlace) out = a;
  } else if (how == How::kInPlace) {
    return "a wider C cannot be computed in place";
  }

  Problem p{
      .rows = rows, .cols = cols, .dtype = ScalarOf<TA>::value, .layout = layout, .side = side};
  p.diagonal_dtype = ScalarOf<TD>::value;
  p.result_dtype = ScalarOf<TC>::value;
  const std::string prepared = PrepareDiagonals(
      p, absl::string_view(reinterpret_cast<const char*>(l.data()), l.size() * sizeof(TD)),
      absl::string_view(reinterpret_cast<const char*>(r.data()), r.size() * sizeof(TD)));
  CpuDevice cpu(3);
  auto job = cpu.Begin(p, BackendKind::kCpu, reinterpret_cast<const std::byte*>(prepared.data()),
                       JobMode::kWhole, 0);
  if (!job.ok()) return std::string(job.status().message());
  CopyingMemory memory;
  const int64_t line = p.line_len();
  // Tiles of 3 lines (the stream's blocks); the whole matrix otherwise.
  const int64_t tile_lines = how == How::kTiles ? 3 : p.lines();
  for (int64_t first = 0; first < p.lines(); first += tile_lines) {
    const int64_t lines = std::min(tile_lines, p.lines() - first);
    const void* in = how == How::kInPlace ? static_cast<const void*>(out.data() + first * line)
                                          : static_cast<const void*>(a.data() + first * line);
    Tile t{static_cast<const std::byte*>(in),
           reinterpret_cast<std::byte*>(out.data() + first * line), first, lines};
    if (how == How::kThrough) t.memory = &memory;
    absl::Status s = (*job)->Process(t, nullptr, nullptr);
    if (!s.ok()) return std::string(s.message());
  }
  if (how == How::kThrough && (memory.reads() == 0 || memory.reads() != memory.writes())) {
    return "the tile in other memory was not read and written through TileMemory";
  }
  std::string failures;
  int count = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const size_t at =
          static_cast<size_t>(layout == Layout::kRowMajor ? i * cols + j : j * rows + i);
      Compute<TC> lk{}, rk{};
      const Compute<TC>* lp = nullptr;
      const Compute<TC>* rp = nullptr;
      if (side != Side::kRight) {
        lk = ref::RefWiden<TC>(l[static_cast<size_t>(i)]);
        lp = &lk;
      }
      if (side != Side::kLeft) {
        rk = ref::RefWiden<TC>(side == Side::kBoth ? r[static_cast<size_t>(j)]
                                                   : l[static_cast<size_t>(j)]);
        rp = &rk;
      }
      const TC want = ref::Element<TA, TC>(a[at], lp, rp);
      if (!ref::Same(out[at], want) && ++count <= 3) {
        failures += "C[" + std::to_string(i) + "][" + std::to_string(j) + "]: got " +
                    ref::Show(out[at]) + " want " + ref::Show(want) + "\n";
      }
    }
  }
  if (count > 3) failures += std::to_string(count) + " mismatches in all\n";
  return failures;
}

template <typename TA, typename TD, typename TC = TA>
void RunAll(uint64_t seed) {
  for (Layout layout : {Layout::kRowMajor, Layout::kColMajor}) {
    for (Side side : {Side::kLeft, Side::kRight, Side::kBoth}) {
      for (How how : {How::kTiles, How::kInPlace, How::kThrough}) {
        // A wider C has a buffer of its own: never in place.
        if (!std::is_same_v<TA, TC> && how == How::kInPlace) continue;
        // 29x23: odd lines (vector tails); 300x260: over the pool's grain,
        // so several threads and, through TileMemory, several pieces.
        for (auto [rows, cols] : {std::pair<int64_t, int64_t>{29, 23}, {300, 260}}) {
          const std::string what = std::string(ScalarName(ScalarOf<TA>::value)) + " A, " +
                                   ScalarName(ScalarOf<TD>::value) + " d, " +
                                   ScalarName(ScalarOf<TC>::value) + " C, " +
                                   (layout == Layout::kRowMajor ? "row" : "col") + ", " +
                                   std::string(SideName(side)) + ", " +
                                   (how == How::kTiles     ? "tiles"
                                    : how == How::kInPlace ? "in place"
                                                           : "through TileMemory") +
                                   ", " + std::to_string(rows) + "x" + std::to_string(cols);
          EXPECT_EQ((Run<TA, TD, TC>(rows, cols, layout, side, how, ++seed)), "") << what;
        }
      }
    }
  }
}

TEST(CpuDTypeJob, Float16) { RunAll<Half, Half>(10); }
TEST(CpuDTypeJob, BFloat16) { RunAll<BFloat16, BFloat16>(20); }
TEST(CpuDTypeJob, Float32) { RunAll<float, float>(30); }
TEST(CpuDTypeJob, Float64) { RunAll<double, double>(40); }
TEST(CpuDTypeJob, Complex64) { RunAll<Complex64, Complex64>(50); }
TEST(CpuDTypeJob, Complex128) { RunAll<Complex128, Complex128>(60); }
TEST(CpuDTypeJob, Float64WithFloat16Diagonal) { RunAll<double, Half>(70); }
TEST(CpuDTypeJob, Float32WithBFloat16Diagonal) { RunAll<float, BFloat16>(80); }
TEST(CpuDTypeJob, Complex64WithFloat32Diagonal) { RunAll<Complex64, float>(90); }
TEST(CpuDTypeJob, Complex128WithComplex64Diagonal) { RunAll<Complex128, Complex64>(100); }
// C of a wider dtype than A's: computed into other memory, through
// TileMemory into a piece buffer of C's size.
TEST(CpuDTypeJob, Float32WithFloat64DiagonalIntoFloat64) { RunAll<float, double, double>(110); }
TEST(CpuDTypeJob, Float16WithBFloat16DiagonalIntoFloat32) { RunAll<Half, BFloat16, float>(120); }
TEST(CpuDTypeJob, Float64WithComplex64DiagonalIntoComplex128) {
  RunAll<double, Complex64, Complex128>(130);
}
TEST(CpuDTypeJob, Float16IntoComplex128) { RunAll<Half, Half, Complex128>(140); }

// What a job holds: A and C in their dtypes, the diagonals as prepared.
TEST(CpuDTypeJob, FootprintCountsThePreparedDiagonals) {
  CpuDevice cpu(1);
  Problem p{.rows = 100, .cols = 30, .dtype = DType::kFloat16, .side = Side::kBoth};
  // float16 diagonals are held as float32: rows*4 rounded up to 256, cols*4.
  EXPECT_EQ(p.prepared_diag_bytes(), 512 + 30 * 4);
  EXPECT_EQ(cpu.Footprint(p, JobMode::kWhole, 1 << 20), 2 * 100 * 30 * 2 + 512 + 30 * 4);
  EXPECT_EQ(cpu.Footprint(p, JobMode::kHostRegion, 1 << 20), 512 + 30 * 4);
  Problem q{.rows = 100, .cols = 30, .dtype = DType::kComplex128, .side = Side::kLeft};
  q.diagonal_dtype = DType::kFloat32;
  EXPECT_EQ(cpu.Footprint(q, JobMode::kWhole, 1 << 20), 2 * 100 * 30 * 16 + 100 * 16);
  // A wider C: A's bytes in, C's out; a streamed job's window at C's block
  // size (a block of A of 1 MiB is 2 MiB of float64 C).
  Problem w{.rows = 100, .cols = 30, .dtype = DType::kFloat32, .side = Side::kRight};
  w.diagonal_dtype = DType::kFloat64;
  w.result_dtype = DType::kFloat64;
  EXPECT_EQ(cpu.Footprint(w, JobMode::kWhole, 1 << 20), 100 * 30 * 4 + 100 * 30 * 8 + 30 * 8);
  EXPECT_EQ(cpu.Footprint(w, JobMode::kStreamed, 1 << 20), 2 * 4 * (2 << 20) + 30 * 8);
  EXPECT_EQ(cpu.Footprint(w, JobMode::kHostRegion, 1 << 20), 30 * 8);
}

}  // namespace
}  // namespace dgmm
