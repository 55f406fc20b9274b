// Element types end to end: every element type, a promoted diagonal, a result
// of a wider dtype than A's (NumPy's result type of A and d, or a stated
// wider result_dtype), both layouts and every side (SIDE_BOTH included) through dgmm::Client and a
// real dgmm-server on every path a job can take: Multiply, MultiplyStream (many blocks), striping
// (unary and streamed parts), MultiplyBatch, and the same-host path (process memory, or a staging
// region, whole or in blocks). Each output is poisoned first and compared element by element, bit
// for bit (any NaN equals any NaN), with tests/support/dtype_reference.h, which computes (l·a)·r
// from the definition by its own means; the operands are fresh random values with IEEE specials,
// subnormals and half values whose products round. Built twice: for the CPU backend (label
// integration) and, with DGMM_DTYPE_GPU, for the CUDA kernel and cuBLAS on a GPU server (label
// gpu).
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dgmm/client.h"
#include "dgmm/regions.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/dtype_reference.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;

#if defined(DGMM_DTYPE_GPU)
constexpr v1::Backend kBackend = v1::BACKEND_CUDA_KERNEL;
#else
constexpr v1::Backend kBackend = v1::BACKEND_CPU;
#endif

ServerProcess& SharedServer() {
#if defined(DGMM_DTYPE_GPU)
  // Pieces of at most 160 bytes: the GPU pipeline groups whole lines of the
  // narrow types and cuts the wide types' lines into parts, each piece with
  // its own offsets into the prepared diagonals.
  static ServerProcess server({"--threads=2", "--allow_regions", "--cuda_tile_bytes=160"});
#else
  static ServerProcess server({"--threads=2", "--allow_regions"});
#endif
  return server;
}

#if defined(DGMM_DTYPE_GPU)
bool ServerHasGpu() {
  Client client(SharedServer().address());
  auto info = client.GetServerInfo();
  if (!info.ok()) return false;
  for (const auto& d : info->devices()) {
    if (d.index() >= 0 && d.in_service()) return true;
  }
  return false;
}
#endif

void SkipWithoutGpu() {
#if defined(DGMM_DTYPE_GPU)
  if (!ServerHasGpu())
    GTEST_SKIP() << "dgmm-gpu-skip: no CUDA device (the server has no GPU in service)";
#endif
}

template <typename T>
constexpr v1::DType WireOf();
template <>
constexpr v1::DType WireOf<Half>() {
  return v1::DTYPE_FLOAT16;
}
template <>
constexpr v1::DType WireOf<BFloat16>() {
  return v1::DTYPE_BFLOAT16;
}
template <>
constexpr v1::DType WireOf<float>() {
  return v1::DTYPE_FLOAT32;
}
template <>
constexpr v1::DType WireOf<double>() {
  return v1::DTYPE_FLOAT64;
}
template <>
constexpr v1::DType WireOf<Complex64>() {
  return v1::DTYPE_COMPLEX64;
}
template <>
constexpr v1::DType WireOf<Complex128>() {
  return v1::DTYPE_COMPLEX128;
}

enum class Route {
  kUnary,
  kStream,
  kStripedUnary,
  kStripedStream,
  kBatch,
  kProcessMemory,
  kStagingRegion,
  kRegionBlocks
};
constexpr Route kRoutes[] = {Route::kUnary,         Route::kStream,      Route::kStripedUnary,
                             Route::kStripedStream, Route::kBatch,       Route::kProcessMemory,
                             Route::kStagingRegion, Route::kRegionBlocks};

const char* RouteName(Route r) {
  switch (r) {
    case Route::kUnary:
      return "unary";
    case Route::kStream:
      return "stream";
    case Route::kStripedUnary:
      return "striped-unary";
    case Route::kStripedStream:
      return "striped-stream";
    case Route::kBatch:
      return "batch";
    case Route::kProcessMemory:
      return "process-memory";
    case Route::kStagingRegion:
      return "staging-region";
    case Route::kRegionBlocks:
      return "region-blocks";
  }
  return "?";
}

ClientOptions OptionsFor(Route r) {
  ClientOptions o;
  o.same_host =
      r == Route::kProcessMemory || r == Route::kStagingRegion || r == Route::kRegionBlocks;
  o.same_host_min_bytes = 0;
  o.process_memory = r == Route::kProcessMemory;
  if (r == Route::kRegionBlocks) o.same_host_blocks = 3;
  if (r == Route::kStripedUnary || r == Route::kStripedStream) o.stripes = 3;
  // Streams of many blocks: a few lines each.
  o.chunk_bytes = 512;
  return o;
}

// One job's operands and the reference's answer. TC: C's dtype, NumPy's
// result type of TA and TD (A's for a narrower or equal diagonal), or, with
// `state_result`, a wider one stated as the job's result_dtype.
template <typename TA, typename TD, typename TC = TA>
struct Case {
  int64_t rows, cols;
  v1::Layout layout;
  v1::Side side;
  bool state_result = false;
  std::vector<TA> a;
  std::vector<TD> l, r;  // l: the one diagonal of LEFT/RIGHT, or BOTH's left
  std::vector<TC> out;

  Case(int64_t rows_, int64_t cols_, v1::Layout layout_, v1::Side side_, uint64_t seed)
      : rows(rows_), cols(cols_), layout(layout_), side(side_) {
    std::mt19937_64 rng(seed);
    a.resize(static_cast<size_t>(rows * cols));
    for (auto& x : a) x = ref::Value<TA>(rng);
    l.resize(static_cast<size_t>(side == v1::SIDE_RIGHT ? cols : rows));
    for (auto& x : l) x = ref::Value<TD>(rng);
    if (side == v1::SIDE_BOTH) {
      r.resize(static_cast<size_t>(cols));
      for (auto& x : r) x = ref::Value<TD>(rng);
    }
    out.resize(a.size());
    std::memset(static_cast<void*>(out.data()), 0xff, out.size() * sizeof(TC));  // NaN
  }

  Job MakeJob() const {
    Job job;
    job.matrix = MatrixView{a.data(), rows, cols, WireOf<TA>(), layout};
    job.diagonal = l.data();
    job.diagonal_bytes = l.size() * sizeof(TD);
    if (side == v1::SIDE_BOTH) {
      job.right_diagonal = r.data();
      job.right_diagonal_bytes = r.size() * sizeof(TD);
    }
    job.side = side;
    job.backend = kBackend;
    job.diagonal_dtype = WireOf<TD>();
    if (state_result) job.result_dtype = WireOf<TC>();
    return job;
  }
  size_t out_bytes() const { return out.size() * sizeof(TC); }

  // "" or the first mismatches.
  std::string Check() const {
    std::string failures;
    int count = 0;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t at = layout == v1::LAYOUT_ROW_MAJOR ? i * cols + j : j * rows + i;
        Compute<TC> lk{}, rk{};
        const Compute<TC>* lp = nullptr;
        const Compute<TC>* rp = nullptr;
        if (side == v1::SIDE_LEFT || side == v1::SIDE_BOTH) {
          lk = ref::RefWiden<TC>(l[static_cast<size_t>(i)]);
          lp = &lk;
        }
        if (side == v1::SIDE_RIGHT) {
          rk = ref::RefWiden<TC>(l[static_cast<size_t>(j)]);
          rp = &rk;
        } else if (side == v1::SIDE_BOTH) {
          rk = ref::RefWiden<TC>(r[static_cast<size_t>(j)]);
          rp = &rk;
        }
        const TC want = ref::Element<TA, TC>(a[static_cast<size_t>(at)], lp, rp);
        const TC got = out[static_cast<size_t>(at)];
        if (!ref::Same(got, want) && ++count <= 3) {
          absl::StrAppend(&failures, "C[", i, "][", j, "]: got ", ref::Show(got), " want ",
                          ref::Show(want), " (a ", ref::Show(a[static_cast<size_t>(at)]), ")\n");
        }
      }
    }
    if (count > 3) absl::StrAppend(&failures, count, " mismatches in all\n");
    return failures;
  }
};

template <typename TA, typename TD, typename TC = TA>
void RunAllRoutes(uint64_t seed, bool state_result = false) {
  const std::string pair =
      absl::StrCat(v1::DType_Name(WireOf<TA>()), " A, ", v1::DType_Name(WireOf<TD>()), " d, ",
                   v1::DType_Name(WireOf<TC>()), state_result ? " C (stated)" : " C");
  for (Route route : kRoutes) {
    Client client(SharedServer().address(), OptionsFor(route));
    for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
      for (v1::Side side : {v1::SIDE_LEFT, v1::SIDE_RIGHT, v1::SIDE_BOTH}) {
        const std::string what = absl::StrCat(pair, ", ", v1::Layout_Name(layout), ", ",
                                              v1::Side_Name(side), ", ", RouteName(route));
        ++seed;
        // 19x13: lines of odd length, so vector paths have tails.
        Case<TA, TD, TC> c(19, 13, layout, side, seed);
        c.state_result = state_result;
        const Job job = c.MakeJob();
        const size_t out_bytes = c.out_bytes();
        // The client sizes C as the server computes it.
        ASSERT_EQ(ResultDType(job), WireOf<TC>()) << what;
        ASSERT_EQ(ResultBytes(job).value_or(0), out_bytes) << what;
        absl::StatusOr<JobResult> result;
        if (route == Route::kBatch) {
          Case<TA, TD, TC> other(7, 5, layout, side, seed + 1000);
          other.state_result = state_result;
          std::vector<BatchItem> items = {{job, c.out.data(), out_bytes},
                                          {other.MakeJob(), other.out.data(), other.out_bytes()}};
          absl::StatusOr<BatchResult> batch = client.MultiplyBatch(items);
          ASSERT_TRUE(batch.ok()) << what << ": " << batch.status();
          ASSERT_EQ(batch->jobs.size(), 2u) << what;
          for (const auto& r : batch->jobs) {
            ASSERT_TRUE(r.ok()) << what << ": " << r.status();
            EXPECT_EQ(r->backend(), kBackend) << what;
          }
          EXPECT_EQ(batch->jobs[0]->bytes_out(), static_cast<int64_t>(out_bytes)) << what;
          EXPECT_EQ(other.Check(), "") << what << " (second job)";
        } else {
          if (route == Route::kStream || route == Route::kStripedStream) {
            result = client.MultiplyStream(job, c.out.data(), out_bytes);
          } else if (route == Route::kUnary) {
            result = client.MultiplyUnary(job, c.out.data(), out_bytes);
          } else {
            result = client.Multiply(job, c.out.data(), out_bytes);
          }
          ASSERT_TRUE(result.ok()) << what << ": " << result.status();
          EXPECT_EQ(result->stats.backend(), kBackend) << what;
          if (route == Route::kProcessMemory || route == Route::kStagingRegion ||
              route == Route::kRegionBlocks) {
            EXPECT_EQ(result->mode, TransferMode::kRegion) << what;
            EXPECT_EQ(result->process_memory, route == Route::kProcessMemory) << what;
          }
          if (route == Route::kStripedUnary || route == Route::kStripedStream) {
            EXPECT_EQ(result->stripes, 3) << what;
          } else {
            // The server counts C's bytes out (the parts of region blocks
            // summed).
            EXPECT_EQ(result->stats.bytes_out(), static_cast<int64_t>(out_bytes)) << what;
          }
          EXPECT_EQ(result->received_bytes, static_cast<int64_t>(out_bytes)) << what;
        }
        EXPECT_EQ(c.Check(), "") << what;
      }
    }
  }
}

class DTypeClientTest : public ::testing::Test {
 protected:
  void SetUp() override { SkipWithoutGpu(); }
};

TEST_F(DTypeClientTest, Float16) { RunAllRoutes<Half, Half>(100); }
TEST_F(DTypeClientTest, BFloat16) { RunAllRoutes<BFloat16, BFloat16>(200); }
TEST_F(DTypeClientTest, Float32) { RunAllRoutes<float, float>(300); }
TEST_F(DTypeClientTest, Float64) { RunAllRoutes<double, double>(400); }
TEST_F(DTypeClientTest, Complex64) { RunAllRoutes<Complex64, Complex64>(500); }
TEST_F(DTypeClientTest, Complex128) { RunAllRoutes<Complex128, Complex128>(600); }
// A diagonal of a narrower dtype, promoted into A's.
TEST_F(DTypeClientTest, Float64WithFloat32Diagonal) { RunAllRoutes<double, float>(700); }
TEST_F(DTypeClientTest, Float64WithFloat16Diagonal) { RunAllRoutes<double, Half>(800); }
TEST_F(DTypeClientTest, Float32WithBFloat16Diagonal) { RunAllRoutes<float, BFloat16>(900); }
TEST_F(DTypeClientTest, Complex64WithFloat32Diagonal) { RunAllRoutes<Complex64, float>(1000); }
TEST_F(DTypeClientTest, Complex64WithFloat16Diagonal) { RunAllRoutes<Complex64, Half>(1100); }
TEST_F(DTypeClientTest, Complex128WithComplex64Diagonal) {
  RunAllRoutes<Complex128, Complex64>(1200);
}
TEST_F(DTypeClientTest, Complex128WithBFloat16Diagonal) {
  RunAllRoutes<Complex128, BFloat16>(1300);
}

// A result of a wider dtype than A's: NumPy's result type of A and d ...
TEST_F(DTypeClientTest, Float32WithFloat64DiagonalGivesFloat64) {
  RunAllRoutes<float, double, double>(2000);
}
TEST_F(DTypeClientTest, Float16WithFloat32DiagonalGivesFloat32) {
  RunAllRoutes<Half, float, float>(2100);
}
TEST_F(DTypeClientTest, Float16WithBFloat16DiagonalGivesFloat32) {
  RunAllRoutes<Half, BFloat16, float>(2200);
}
TEST_F(DTypeClientTest, Float32WithComplex64DiagonalGivesComplex64) {
  RunAllRoutes<float, Complex64, Complex64>(2300);
}
TEST_F(DTypeClientTest, Float64WithComplex64DiagonalGivesComplex128) {
  RunAllRoutes<double, Complex64, Complex128>(2400);
}
TEST_F(DTypeClientTest, Float32WithComplex128DiagonalGivesComplex128) {
  RunAllRoutes<float, Complex128, Complex128>(2500);
}
// ... or a wider result_dtype stated (float32 with float32 into float64;
// float16 into complex128, C eight times A's bytes).
TEST_F(DTypeClientTest, StatedFloat64ResultOfFloat32) {
  RunAllRoutes<float, float, double>(2600, /*state_result=*/true);
}
TEST_F(DTypeClientTest, StatedComplex128ResultOfFloat16) {
  RunAllRoutes<Half, Half, Complex128>(2700, /*state_result=*/true);
}

// What the server does not compute is refused, never computed wrong: a
// stated result the promotion cannot widen to exactly, cuBLAS outside its
// dgmm (a promoted result included), a missing right diagonal; and an
// output buffer of A's size for a wider C, by the client.
TEST_F(DTypeClientTest, RefusalsAreInvalidArgumentAndSaySo) {
  Client client(SharedServer().address(), OptionsFor(Route::kUnary));
  Case<double, double, float> narrower(4, 3, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1);
  narrower.state_result = true;
  absl::StatusOr<JobResult> r =
      client.Multiply(narrower.MakeJob(), narrower.out.data(), narrower.out_bytes());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("result_dtype float32 cannot hold the product of a float64 matrix and a "
                        "float64 diagonal"));

  Case<float, double, double> wider(4, 3, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 4);
  r = client.Multiply(wider.MakeJob(), wider.out.data(), wider.out.size() * sizeof(float));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("the output buffer holds 48 bytes; the result needs 96 (DTYPE_FLOAT64)"));
  Job cublas = wider.MakeJob();
  cublas.backend = v1::BACKEND_CUBLAS;
  r = client.Multiply(cublas, wider.out.data(), wider.out_bytes());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("BACKEND_CUBLAS runs cuBLAS's S, D, C and Z dgmm"));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("a float32 matrix with a float64 diagonal and a float64 result"));

  Case<Half, Half> half(4, 3, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 2);
  Job job = half.MakeJob();
  job.backend = v1::BACKEND_CUBLAS;
  r = client.Multiply(job, half.out.data(), half.out.size() * 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("BACKEND_CUBLAS runs cuBLAS's"));

  Case<float, float> both(4, 3, v1::LAYOUT_COL_MAJOR, v1::SIDE_BOTH, 3);
  job = both.MakeJob();
  job.right_diagonal = nullptr;
  job.right_diagonal_bytes = 0;
  r = client.Multiply(job, both.out.data(), both.out.size() * 4);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("right_diagonal has 0 bytes"));
}

// MultiplyRegion with A, C and both diagonals in one registered region
// (RegionRef diagonal and right_diagonal), C apart from A and in place; and
// the refusals of refs that do not fit the side.
// In place (out == A) is a job only where C has A's size; an out over A
// for a wider C, or any partial overlap, is refused by the client before
// anything is sent (a wider C would land on lines of A not yet sent).
TEST_F(DTypeClientTest, AnOutputOverlappingTheMatrixIsRefusedUnlessExactlyInPlace) {
  Client client(SharedServer().address(), OptionsFor(Route::kStream));
  const int64_t rows = 40, cols = 30;
  std::vector<double> storage(rows * cols);  // room for C in float64
  std::vector<float> a_values(rows * cols), d32(cols);
  std::vector<double> d64(cols);
  for (int64_t i = 0; i < rows * cols; ++i) a_values[i] = static_cast<float>(i % 17) - 8.0f;
  for (int64_t j = 0; j < cols; ++j) d64[j] = d32[j] = 0.5f + static_cast<float>(j % 5);
  auto* a = reinterpret_cast<float*>(storage.data());
  std::copy(a_values.begin(), a_values.end(), a);
  Job job;
  job.matrix = {a, rows, cols, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR};
  job.diagonal = d64.data();
  job.diagonal_bytes = d64.size() * sizeof(double);
  job.diagonal_dtype = v1::DTYPE_FLOAT64;
  absl::StatusOr<JobResult> r = client.Multiply(job, storage.data(), storage.size() * 8);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("is wider than it"));
  // A float32 result one element into A: a partial overlap.
  job.diagonal = d32.data();
  job.diagonal_bytes = d32.size() * sizeof(float);
  job.diagonal_dtype = v1::DTYPE_UNSPECIFIED;
  r = client.Multiply(job, a + 1, rows * cols * sizeof(float));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("not exactly in place"));
  // Exactly in place, C of A's size: computed (A was left as it was).
  r = client.Multiply(job, a, rows * cols * sizeof(float));
  ASSERT_TRUE(r.ok()) << r.status();
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(a[i], a_values[i] * d32[i % cols]) << i;
  }
}

// Jobs on a region the server has pinned (after its reuse): on a GPU server
// the pipeline DMAs straight from and to the region (no staging), every
// dtype, a promoted result, both layouts, every side, apart and in place;
// on the CPU the same jobs through its own path.
template <typename TA, typename TD, typename TC = TA>
void RunOnPinnedRegion(Client& client, SharedMemoryRegion& region, uint64_t seed) {
  const std::string pair =
      absl::StrCat(v1::DType_Name(WireOf<TA>()), " A, ", v1::DType_Name(WireOf<TD>()), " d");
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{19, 13}, {257, 129}}) {
    for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
      for (v1::Side side : {v1::SIDE_LEFT, v1::SIDE_RIGHT, v1::SIDE_BOTH}) {
        for (bool in_place : {false, true}) {
          if (in_place && sizeof(TC) != sizeof(TA)) continue;
          const std::string what =
              absl::StrCat(pair, ", ", rows, "x", cols, ", ", v1::Layout_Name(layout), ", ",
                           v1::Side_Name(side), in_place ? ", in place" : "");
          Case<TA, TD, TC> c(rows, cols, layout, side, ++seed);
          const size_t a_bytes = c.a.size() * sizeof(TA);
          const size_t c_at = in_place ? 0 : (a_bytes + 255) / 256 * 256;
          ASSERT_LE(c_at + c.out_bytes(), region.size()) << what;
          char* base = region.bytes();
          std::memset(base, 0xff, c_at + c.out_bytes());  // C poisoned (NaN)
          std::memcpy(base, c.a.data(), a_bytes);
          absl::StatusOr<JobResult> r = MultiplyRegion(
              client,
              RegionJobOf(c.MakeJob(), region.Ref(0), region.Ref(static_cast<int64_t>(c_at))));
          ASSERT_TRUE(r.ok()) << what << ": " << r.status();
          std::memcpy(c.out.data(), base + c_at, c.out_bytes());
          EXPECT_EQ(c.Check(), "") << what;
        }
      }
    }
  }
}

TEST_F(DTypeClientTest, JobsOnAPinnedRegion) {
  Client client(SharedServer().address(), OptionsFor(Route::kStagingRegion));
  // Room for the largest case: 257x129 complex128 A and C.
  const size_t bytes = 2 * 257 * 129 * sizeof(Complex128) + 512;
  auto region = SharedMemoryRegion::Create(client, bytes);
  ASSERT_TRUE(region.ok()) << region.status();
  // Reused: the server pins it in the background after its second job.
  for (int i = 0; i < 2; ++i) {
    RunOnPinnedRegion<float, float>(client, **region, 7000);
    if (::testing::Test::HasFailure()) return;
  }
#if defined(DGMM_DTYPE_GPU)  // a CPU server has nothing to pin
  const absl::Time end = absl::Now() + absl::Seconds(30);
  for (;;) {
    absl::StatusOr<v1::GetRegionStatusResponse> st = GetRegionStatus(client, (*region)->name());
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->regions_size(), 1);
    if (st->regions(0).pinned()) break;
    ASSERT_LT(absl::Now(), end) << "the server did not pin the reused region";
    absl::SleepFor(absl::Milliseconds(20));
  }
#endif
  RunOnPinnedRegion<Half, Half>(client, **region, 7100);
  RunOnPinnedRegion<BFloat16, BFloat16>(client, **region, 7200);
  RunOnPinnedRegion<float, float>(client, **region, 7300);
  RunOnPinnedRegion<double, double>(client, **region, 7400);
  RunOnPinnedRegion<Complex64, Complex64>(client, **region, 7500);
  RunOnPinnedRegion<Complex128, Complex128>(client, **region, 7600);
  RunOnPinnedRegion<float, double, double>(client, **region, 7700);
  RunOnPinnedRegion<Half, Complex128, Complex128>(client, **region, 7800);
  RunOnPinnedRegion<BFloat16, Complex64, Complex64>(client, **region, 7900);
}

TEST_F(DTypeClientTest, RegionJobWithBothDiagonalsInTheRegion) {
  Client client(SharedServer().address(), OptionsFor(Route::kStagingRegion));
  using TA = Complex64;
  using TD = Half;
  for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
    for (bool in_place : {false, true}) {
      Case<TA, TD> c(21, 11, layout, v1::SIDE_BOTH, in_place ? 71 : 72);
      const size_t a_bytes = c.a.size() * sizeof(TA);
      const size_t l_at = 2 * a_bytes, r_at = l_at + 64;
      auto region = SharedMemoryRegion::Create(client, r_at + c.r.size() * sizeof(TD));
      ASSERT_TRUE(region.ok()) << region.status();
      char* base = (*region)->bytes();
      std::memcpy(base, c.a.data(), a_bytes);
      std::memset(base + a_bytes, 0xff, a_bytes);  // C poisoned
      std::memcpy(base + l_at, c.l.data(), c.l.size() * sizeof(TD));
      std::memcpy(base + r_at, c.r.data(), c.r.size() * sizeof(TD));
      Job job = c.MakeJob();
      RegionJob rj = RegionJobOf(job, (*region)->Ref(0),
                                 (*region)->Ref(in_place ? 0 : static_cast<int64_t>(a_bytes)));
      rj.diagonal = nullptr;
      rj.diagonal_bytes = 0;
      rj.right_diagonal = nullptr;
      rj.right_diagonal_bytes = 0;
      rj.diagonal_ref = (*region)->Ref(static_cast<int64_t>(l_at));
      rj.right_diagonal_ref = (*region)->Ref(static_cast<int64_t>(r_at));
      absl::StatusOr<JobResult> r = MultiplyRegion(client, rj);
      ASSERT_TRUE(r.ok()) << r.status();
      std::memcpy(c.out.data(), base + (in_place ? 0 : a_bytes), a_bytes);
      EXPECT_EQ(c.Check(), "") << v1::Layout_Name(layout) << (in_place ? " in place" : "");

      // One diagonal in the region and the other inline, or the other
      // missing: refused.
      RegionJob half = rj;
      half.right_diagonal_ref.reset();
      half.right_diagonal = c.r.data();
      half.right_diagonal_bytes = c.r.size() * sizeof(TD);
      r = MultiplyRegion(client, half);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(r.status().message()),
                  HasSubstr("for SIDE_BOTH both diagonals are inline (header.diagonal and "
                            "header.right_diagonal) or both in regions"));
      half.right_diagonal = nullptr;
      half.right_diagonal_bytes = 0;
      r = MultiplyRegion(client, half);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(r.status().message()),
                  HasSubstr("a SIDE_BOTH job has both diagonals inline"));
      // A right_diagonal ref on a one-sided job: refused.
      RegionJob one = rj;
      one.side = v1::SIDE_LEFT;
      r = MultiplyRegion(client, one);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(r.status().message()),
                  HasSubstr("a right_diagonal ref is for SIDE_BOTH only"));
    }
  }
}

// A region job whose C is wider than A's: the result ref is sized in C's
// bytes, apart from A; in place, and a result ref with room for A's bytes
// but not C's, are refused.
TEST_F(DTypeClientTest, PromotedRegionJobWritesCInItsOwnBytes) {
  Client client(SharedServer().address(), OptionsFor(Route::kStagingRegion));
  for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
    Case<float, Complex64, Complex64> c(21, 11, layout, v1::SIDE_BOTH,
                                        layout == v1::LAYOUT_ROW_MAJOR ? 81 : 82);
    const size_t a_bytes = c.a.size() * sizeof(float);
    const size_t c_at = (a_bytes + 63) / 64 * 64;
    const size_t c_bytes = c.out_bytes();
    auto region = SharedMemoryRegion::Create(client, c_at + c_bytes);
    ASSERT_TRUE(region.ok()) << region.status();
    char* base = (*region)->bytes();
    std::memcpy(base, c.a.data(), a_bytes);
    std::memset(base + c_at, 0xff, c_bytes);  // C poisoned
    const Job job = c.MakeJob();
    absl::StatusOr<JobResult> r = MultiplyRegion(
        client, RegionJobOf(job, (*region)->Ref(0), (*region)->Ref(static_cast<int64_t>(c_at))));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->stats.bytes_in(), static_cast<int64_t>(a_bytes));
    EXPECT_EQ(r->stats.bytes_out(), static_cast<int64_t>(c_bytes));
    std::memcpy(c.out.data(), base + c_at, c_bytes);
    EXPECT_EQ(c.Check(), "") << v1::Layout_Name(layout);

    // Client::Multiply with A and C in this client's region: a region job
    // on them, no copy (C of C's size at c_at).
    std::memset(base + c_at, 0xff, c_bytes);
    Job in_region = job;
    in_region.matrix.data = base;
    absl::StatusOr<JobResult> own = client.Multiply(in_region, base + c_at, c_bytes);
    ASSERT_TRUE(own.ok()) << own.status();
    EXPECT_EQ(own->mode, TransferMode::kRegion);
    EXPECT_EQ(own->socket_reason, "");
    EXPECT_EQ(own->same_host.copy_in, 0);  // no staging copy: the region job itself
    EXPECT_FALSE(own->process_memory);
    std::memcpy(c.out.data(), base + c_at, c_bytes);
    EXPECT_EQ(c.Check(), "") << v1::Layout_Name(layout) << ", Client::Multiply on the region";

    r = MultiplyRegion(client, RegionJobOf(job, (*region)->Ref(0), (*region)->Ref(0)));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("a result of a wider dtype than the matrix's cannot be computed in "
                          "place"));
    const int64_t short_at = static_cast<int64_t>((*region)->size() - c_bytes + 8);
    r = MultiplyRegion(client, RegionJobOf(job, (*region)->Ref(0), (*region)->Ref(short_at)));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(r.status().message()),
        HasSubstr(absl::StrCat("the result needs ", c_bytes, " bytes at offset ", short_at)));
  }
}

// A promoted job's footprint counts C's wider bytes: a float32 74x74 job
// fits a 64 KiB host budget, the same A with a float64 diagonal (C float64)
// does not.
TEST_F(DTypeClientTest, BudgetCountsAPromotedResultsWiderBytes) {
  ServerProcess small({"--threads=2", "--host_memory_budget=64KiB", "--backend=cpu"});
  Client client(small.address(), OptionsFor(Route::kUnary));
  Case<float, float> same(74, 74, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 1800);
  Job job = same.MakeJob();
  job.backend = v1::BACKEND_CPU;
  // 2 * 74 * 74 * 4 + 74 * 4 = 44104: fits.
  auto r = client.MultiplyUnary(job, same.out.data(), same.out_bytes());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(same.Check(), "");
  Case<float, double, double> wider(74, 74, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 1801);
  job = wider.MakeJob();
  job.backend = v1::BACKEND_CPU;
  // 74 * 74 * 4 (A) + 74 * 74 * 8 (C) + 74 * 8 = 66304 > 65536.
  r = client.MultiplyUnary(job, wider.out.data(), wider.out_bytes());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("job needs 66304 bytes of host memory (unary float32 with a float64 "
                        "result 74x74"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("capacity is 65536 bytes"));
}

// A CPU job of a batch whose C is wider computes from a block buffer of A's
// size into the reply, and the batch's need counts that buffer: with a 64
// KiB host budget a 60x60 float32 job with a float64 diagonal fits (14400 A
// + 28800 C + 480 diagonal + 256 + 14400 block = 58336), a 66x66 one does
// not (17424 + 34848 + 528 + 256 + 17424 = 70480; 53056 without the block).
TEST_F(DTypeClientTest, BudgetCountsABatchJobsBlockBufferForAWiderResult) {
  ServerProcess small({"--threads=2", "--host_memory_budget=64KiB", "--backend=cpu"});
  Client client(small.address(), OptionsFor(Route::kBatch));
  Case<float, double, double> fits(60, 60, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1850);
  Job job = fits.MakeJob();
  job.backend = v1::BACKEND_CPU;
  std::vector<BatchItem> items = {{job, fits.out.data(), fits.out_bytes()}};
  absl::StatusOr<BatchResult> batch = client.MultiplyBatch(items);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->jobs.size(), 1u);
  ASSERT_TRUE(batch->jobs[0].ok()) << batch->jobs[0].status();
  EXPECT_EQ(fits.Check(), "");
  Case<float, double, double> over(66, 66, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1851);
  job = over.MakeJob();
  job.backend = v1::BACKEND_CPU;
  items = {{job, over.out.data(), over.out_bytes()}};
  batch = client.MultiplyBatch(items);
  absl::Status refused = batch.ok()
                             ? (batch->jobs.empty() ? absl::OkStatus() : batch->jobs[0].status())
                             : batch.status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("needs 70480 bytes of host memory"));
}

// A streamed job's window counts its result blocks at C's size: with 4 KiB
// blocks a float32 job holds 2 * 4 * 4096 bytes and fits 48 KiB; the same A
// with a float64 diagonal holds 2 * 4 * 8192 (each block of A is 8 KiB of
// C) and does not.
TEST_F(DTypeClientTest, BudgetCountsAPromotedStreamsWiderBlocks) {
  ServerProcess small(
      {"--threads=2", "--host_memory_budget=48KiB", "--max_block_bytes=4KiB", "--backend=cpu"});
  Client client(small.address(), OptionsFor(Route::kStream));
  Case<float, float> same(64, 64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 1900);
  Job job = same.MakeJob();
  job.backend = v1::BACKEND_CPU;
  // 2 * 4 * 4096 + 64 * 4 = 33024: fits.
  auto r = client.MultiplyStream(job, same.out.data(), same.out_bytes());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(same.Check(), "");
  Case<float, double, double> wider(64, 64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 1901);
  job = wider.MakeJob();
  job.backend = v1::BACKEND_CPU;
  // 2 * 4 * 8192 + 64 * 8 = 66048 > 49152.
  r = client.MultiplyStream(job, wider.out.data(), wider.out_bytes());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("job needs 66048 bytes of host memory (streamed float32 with a float64 "
                        "result 64x64"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("capacity is 49152 bytes"));
}

// The budget counts the real bytes: A and C of 16-byte complex128, and the
// diagonals as held (a float16 d of SIDE_BOTH widened to float32, the left
// one rounded up to 256 bytes).
TEST_F(DTypeClientTest, BudgetCountsTheElementSizesAndThePreparedDiagonals) {
  ServerProcess small({"--threads=2", "--host_memory_budget=64KiB", "--backend=cpu"});
  Client client(small.address(), OptionsFor(Route::kUnary));
  Case<Complex128, Complex128> big(50, 50, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 1700);
  // On the CPU whichever build this is (the host budget is the one counted).
  const auto cpu_job = [](const auto& c) {
    Job job = c.MakeJob();
    job.backend = v1::BACKEND_CPU;
    return job;
  };
  auto r = client.MultiplyUnary(cpu_job(big), big.out.data(), big.out.size() * 16);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  // 2 * 50 * 50 * 16 + 50 * 16.
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("job needs 80800 bytes of host memory"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("complex128"));
  Case<Half, Half> fits(100, 150, v1::LAYOUT_ROW_MAJOR, v1::SIDE_BOTH, 1702);
  // 2 * 100 * 150 * 2 + 512 (100 float32, rounded up) + 150 * 4 = 61112: fits.
  r = client.MultiplyUnary(cpu_job(fits), fits.out.data(), fits.out.size() * 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(fits.Check(), "");
  Case<Half, Half> over(100, 170, v1::LAYOUT_ROW_MAJOR, v1::SIDE_BOTH, 1703);
  // 2 * 100 * 170 * 2 + 512 + 170 * 4 = 69192: over.
  r = client.MultiplyUnary(cpu_job(over), over.out.data(), over.out.size() * 2);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("job needs 69192 bytes"));
}

// GetServerInfo names what each backend takes.
TEST_F(DTypeClientTest, ServerInfoListsDTypesAndSidesPerBackend) {
  Client client(SharedServer().address());
  auto info = client.GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->dtypes_size(), 6);
  bool saw_backend = false;
  for (const auto& c : info->capabilities()) {
    std::vector<int> dtypes(c.dtypes().begin(), c.dtypes().end());
    std::vector<int> sides(c.sides().begin(), c.sides().end());
    if (c.backend() == v1::BACKEND_CUBLAS) {
      EXPECT_THAT(dtypes,
                  ::testing::UnorderedElementsAre(v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64,
                                                  v1::DTYPE_COMPLEX64, v1::DTYPE_COMPLEX128));
      EXPECT_THAT(sides, ::testing::UnorderedElementsAre(v1::SIDE_LEFT, v1::SIDE_RIGHT));
      EXPECT_FALSE(c.mixed_diagonal());
    } else {
      EXPECT_EQ(dtypes.size(), 6u);
      EXPECT_THAT(sides,
                  ::testing::UnorderedElementsAre(v1::SIDE_LEFT, v1::SIDE_RIGHT, v1::SIDE_BOTH));
      EXPECT_TRUE(c.mixed_diagonal());
    }
    if (c.backend() == kBackend) saw_backend = true;
  }
  EXPECT_TRUE(saw_backend);
}

#if defined(DGMM_DTYPE_GPU)
// cuBLAS C/Z dgmm: complex products may be fused there, so within a few
// roundings of the reference rather than bit for bit.
template <typename T>
void CublasComplex(uint64_t seed) {
  Client client(SharedServer().address(), OptionsFor(Route::kUnary));
  for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
    for (v1::Side side : {v1::SIDE_LEFT, v1::SIDE_RIGHT}) {
      std::mt19937_64 rng(++seed);
      Case<T, T> c(19, 13, layout, side, seed);
      // Ordinary values only: specials are where fused and unfused differ most.
      using R = decltype(T::re);
      std::uniform_real_distribution<R> u(-2, 2);
      for (auto& x : c.a) x = T{u(rng), u(rng)};
      for (auto& x : c.l) x = T{u(rng), u(rng)};
      Job job = c.MakeJob();
      job.backend = v1::BACKEND_CUBLAS;
      auto r = client.Multiply(job, c.out.data(), c.out.size() * sizeof(T));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->stats.backend(), v1::BACKEND_CUBLAS);
      for (int64_t i = 0; i < c.rows; ++i) {
        for (int64_t j = 0; j < c.cols; ++j) {
          const int64_t at = layout == v1::LAYOUT_ROW_MAJOR ? i * c.cols + j : j * c.rows + i;
          const T a = c.a[static_cast<size_t>(at)];
          const T d = c.l[static_cast<size_t>(side == v1::SIDE_LEFT ? i : j)];
          const long double re =
              static_cast<long double>(a.re) * d.re - static_cast<long double>(a.im) * d.im;
          const long double im =
              static_cast<long double>(a.re) * d.im + static_cast<long double>(a.im) * d.re;
          const T got = c.out[static_cast<size_t>(at)];
          const long double tol = 8 * std::numeric_limits<R>::epsilon() * 4;
          EXPECT_NEAR(got.re, re, tol) << at;
          EXPECT_NEAR(got.im, im, tol) << at;
        }
      }
    }
  }
}
TEST_F(DTypeClientTest, CublasComplex64) { CublasComplex<Complex64>(1400); }
TEST_F(DTypeClientTest, CublasComplex128) { CublasComplex<Complex128>(1500); }

// A server pinned to cuBLAS (--backend=cublas) runs BACKEND_AUTO jobs cuBLAS
// has no dgmm for (a half type, a promoted diagonal, SIDE_BOTH) on the
// kernel, and the others on cuBLAS.
TEST_F(DTypeClientTest, PinnedCublasRunsWhatItCannotTakeOnTheKernel) {
  ServerProcess pinned({"--threads=2", "--backend=cublas"});
  Client client(pinned.address(), OptionsFor(Route::kUnary));
  Case<Half, Half> half(19, 13, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 1600);
  Job job = half.MakeJob();
  job.backend = v1::BACKEND_AUTO;
  auto r = client.Multiply(job, half.out.data(), half.out.size() * sizeof(Half));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.backend(), v1::BACKEND_CUDA_KERNEL);
  EXPECT_EQ(half.Check(), "");
  Case<double, float> promoted(19, 13, v1::LAYOUT_COL_MAJOR, v1::SIDE_BOTH, 1601);
  job = promoted.MakeJob();
  job.backend = v1::BACKEND_AUTO;
  r = client.Multiply(job, promoted.out.data(), promoted.out.size() * sizeof(double));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.backend(), v1::BACKEND_CUDA_KERNEL);
  EXPECT_EQ(promoted.Check(), "");
  // A result wider than A (float32 A, float64 d): the kernel too.
  Case<float, double, double> wider(19, 13, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1603);
  job = wider.MakeJob();
  job.backend = v1::BACKEND_AUTO;
  r = client.Multiply(job, wider.out.data(), wider.out_bytes());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.backend(), v1::BACKEND_CUDA_KERNEL);
  EXPECT_EQ(wider.Check(), "");
  Case<float, float> plain(19, 13, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1602);
  job = plain.MakeJob();
  job.backend = v1::BACKEND_AUTO;
  r = client.Multiply(job, plain.out.data(), plain.out.size() * sizeof(float));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.backend(), v1::BACKEND_CUBLAS);
}
#endif

}  // namespace
}  // namespace dgmm
