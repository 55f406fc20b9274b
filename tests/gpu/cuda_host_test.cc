// Parts of the GPU engine that run on the host alone: how tiles are cut into
// pieces, how CUDA errors become statuses, which launch shape is chosen, and
// how the factory behaves without a GPU. These run (and pass) on machines
// without a GPU as well.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "service/backends/cuda/cuda_devices.h"
#include "service/backends/cuda/cuda_status.h"
#include "service/backends/cuda/dgmm_kernel.h"
#include "service/backends/cuda/tile_split.h"

namespace dgmm::cuda {
namespace {

Problem RowMajor(int64_t rows, int64_t cols, DType t = DType::kFloat32) {
  return Problem{
      .rows = rows, .cols = cols, .dtype = t, .layout = Layout::kRowMajor, .side = Side::kRight};
}

// The pieces cover the tile exactly once, in order, within the limit.
void ExpectCovers(const Problem& p, int64_t first, int64_t lines, int64_t limit) {
  const auto pieces = SplitTile(p, first, lines, limit);
  int64_t offset = 0;
  const int64_t elem = static_cast<int64_t>(p.elem_size());
  for (const Piece& piece : pieces) {
    EXPECT_EQ(piece.byte_offset, offset);
    EXPECT_EQ(piece.bytes, piece.lines * piece.line_len * elem);
    EXPECT_TRUE(piece.bytes <= limit || piece.bytes == elem);
    EXPECT_EQ(piece.byte_offset, (piece.first_line - first) * p.line_bytes() + piece.pos * elem);
    if (piece.lines > 1) {
      EXPECT_EQ(piece.line_len, p.line_len());
    }
    offset += piece.bytes;
  }
  EXPECT_EQ(offset, lines * p.line_bytes());
}

TEST(TileSplit, GroupsWholeLinesAndLeavesARemainder) {
  const Problem p = RowMajor(1001, 257);
  const auto pieces = SplitTile(p, 0, 1001, 3 * p.line_bytes() + 4);
  ASSERT_EQ(pieces.size(), 334u);
  EXPECT_EQ(pieces.front().lines, 3);
  EXPECT_EQ(pieces.back().lines, 2);
  EXPECT_EQ(pieces.back().first_line, 999);
  ExpectCovers(p, 0, 1001, 3 * p.line_bytes() + 4);
}

TEST(TileSplit, CutsLongLinesIntoVectorAlignedParts) {
  const Problem p = RowMajor(2, 1000);
  const auto pieces = SplitTile(p, 5, 2, 100);  // 25 floats -> parts of 24
  ASSERT_FALSE(pieces.empty());
  EXPECT_EQ(pieces[0].line_len, 24);
  EXPECT_EQ(pieces[0].first_line, 5);
  EXPECT_EQ(pieces[1].pos, 24);
  ExpectCovers(p, 5, 2, 100);
}

TEST(TileSplit, CoversEveryShapeAndLimit) {
  for (DType t : {DType::kFloat32, DType::kFloat64}) {
    for (int64_t cols : {1, 3, 4, 17, 1000}) {
      for (int64_t limit : {4, 8, 16, 40, 4096, 1 << 20}) {
        ExpectCovers(RowMajor(37, cols, t), 3, 30, limit);
      }
    }
  }
}

// A ramp: pieces double from ramp_bytes up to the limit, and near the end
// each takes at most half of what is left (not under ramp_bytes).
TEST(TileSplit, RampsUpAndDown) {
  const Problem p = RowMajor(4096, 256);  // 1 KiB lines, 4 MiB in all
  const int64_t kib = 1024;
  const auto pieces = SplitTile(p, 0, 4096, 512 * kib, 64 * kib);
  std::vector<int64_t> sizes;
  for (const Piece& piece : pieces) sizes.push_back(piece.bytes / kib);
  const std::vector<int64_t> want = {64,  128, 256, 512, 512, 512, 512,
                                     512, 512, 288, 144, 72,  64,  8};
  EXPECT_EQ(sizes, want);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  EXPECT_EQ(total, 4096);
  for (int64_t lines : {1, 2, 63, 64, 65, 700, 4096}) {
    for (int64_t limit : {int64_t{4096}, 64 * kib, 512 * kib}) {
      for (int64_t ramp : {int64_t{0}, int64_t{1}, 3 * kib, 64 * kib, 1024 * kib}) {
        SCOPED_TRACE(::testing::Message() << lines << " " << limit << " " << ramp);
        const auto cut = SplitTile(p, 7, lines, limit, ramp);
        int64_t offset = 0;
        for (const Piece& piece : cut) {
          EXPECT_EQ(piece.byte_offset, offset);
          EXPECT_LE(piece.bytes, std::max(limit, p.line_bytes()));
          EXPECT_EQ(piece.first_line, 7 + offset / p.line_bytes());
          offset += piece.bytes;
        }
        EXPECT_EQ(offset, lines * p.line_bytes());
      }
    }
  }
}

// A result of a wider dtype than A's: pieces cut at PieceLimitBytes fit
// `fit` bytes in A's dtype and in C's (a staging buffer and a slot take
// both), and cover the tile once.
TEST(TileSplit, PiecesOfAWiderResultFitInCsBytesToo) {
  const DType all[] = {DType::kFloat16, DType::kBFloat16,  DType::kFloat32,
                       DType::kFloat64, DType::kComplex64, DType::kComplex128};
  int pairs = 0;
  for (DType a : all) {
    for (DType c : all) {
      if (!KernelSupports(a, c)) continue;
      ++pairs;
      for (Layout layout : {Layout::kRowMajor, Layout::kColMajor}) {
        for (int64_t cols : {1, 3, 13, 100}) {
          for (int64_t fit : {16, 160, 256, 4096}) {
            Problem p{.rows = 19, .cols = cols, .dtype = a, .layout = layout};
            p.result_dtype = c;
            SCOPED_TRACE(::testing::Message() << ScalarName(a) << " into " << ScalarName(c) << " "
                                              << cols << " cols, fit " << fit);
            const int64_t limit = PieceLimitBytes(p, fit);
            if (c == a) {
              EXPECT_EQ(limit, fit);
            }
            const int64_t first = p.lines() > 2 ? 2 : 0;
            ExpectCovers(p, first, p.lines() - first, limit);
            const int64_t elem = static_cast<int64_t>(p.elem_size());
            const int64_t out_elem = static_cast<int64_t>(p.out_elem_size());
            for (const Piece& piece : SplitTile(p, first, p.lines() - first, limit)) {
              EXPECT_LE(piece.bytes, fit);
              EXPECT_LE(piece.bytes / elem * out_elem, fit);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(pairs, 19);
}

TEST(TileSplit, EmptyTileHasNoPieces) {
  EXPECT_TRUE(SplitTile(RowMajor(10, 10), 0, 0, 64).empty());
}

TEST(CudaStatus, ErrorsBecomeInternalWithTheCudaText) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
  const absl::Status st = CudaStatus(cudaErrorMemoryAllocation, "cudaMallocAsync");
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("cudaMallocAsync"), std::string::npos) << st;
  EXPECT_NE(st.message().find(cudaGetErrorString(cudaErrorMemoryAllocation)), std::string::npos)
      << st;
  const absl::Status cb = CublasStatus(CUBLAS_STATUS_INVALID_VALUE, "dgmm");
  EXPECT_EQ(cb.code(), absl::StatusCode::kInternal);
  EXPECT_NE(cb.message().find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << cb;
}

TEST(CudaStatus, OnlyContextCorruptingErrorsAreSticky) {
  EXPECT_TRUE(IsStickyError(cudaErrorIllegalAddress));
  EXPECT_TRUE(IsStickyError(cudaErrorLaunchFailure));
  EXPECT_TRUE(IsStickyError(cudaErrorECCUncorrectable));
  EXPECT_FALSE(IsStickyError(cudaSuccess));
  EXPECT_FALSE(IsStickyError(cudaErrorMemoryAllocation));
  EXPECT_FALSE(IsStickyError(cudaErrorInvalidValue));
}

TEST(LaunchPolicy, VectorizesOnlyAlignedWholeVectors) {
  const float* base = reinterpret_cast<const float*>(uintptr_t{1} << 20);
  DeviceTile<float> tile{.in = base,
                         .out = const_cast<float*>(base),
                         .diag = base,
                         .lines = 10,
                         .line_len = 1024,
                         .per_line = false};
  EXPECT_EQ(ChooseLaunchPolicy(tile, 132).vector_width, 4);
  tile.line_len = 1022;
  EXPECT_EQ(ChooseLaunchPolicy(tile, 132).vector_width, 1);
  tile.line_len = 1024;
  tile.diag = base + 1;  // a per-position diagonal must be aligned too
  EXPECT_EQ(ChooseLaunchPolicy(tile, 132).vector_width, 1);
  tile.per_line = true;  // a per-line diagonal is read one scalar at a time
  EXPECT_EQ(ChooseLaunchPolicy(tile, 132).vector_width, 4);
  tile.in = base + 2;
  EXPECT_EQ(ChooseLaunchPolicy(tile, 132).vector_width, 1);
  const DeviceTile<double> d{.in = reinterpret_cast<const double*>(base),
                             .out = reinterpret_cast<double*>(uintptr_t{1} << 21),
                             .diag = nullptr,
                             .lines = 3,
                             .line_len = 8,
                             .per_line = true};
  const LaunchPolicy policy = ChooseLaunchPolicy(d, 132);
  EXPECT_EQ(policy.vector_width, 2);
  EXPECT_GE(policy.grid_blocks, 1);
  EXPECT_LE(policy.grid_blocks, 132 * 8192);
}

TEST(CreateCudaDevices, RejectsOptionsOutOfRange) {
  std::string why;
  CudaOptions o;
  o.streams = 0;
  EXPECT_EQ(CreateCudaDevices(o, &why).status().code(), absl::StatusCode::kInvalidArgument);
  o = CudaOptions{};
  o.tile_bytes = 8;
  EXPECT_EQ(CreateCudaDevices(o, &why).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CreateCudaDevices, SaysWhyWhenThereIsNoDevice) {
  std::string why;
  CudaOptions o;
  o.measure_backend_order = false;
  auto devices = CreateCudaDevices(o, &why);
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (devices->empty()) {
    EXPECT_FALSE(why.empty());
    std::printf("no GPU here: %s\n", why.c_str());
  } else {
    std::printf("%zu GPU(s); the first is %s\n", devices->size(), (*devices)[0]->name().c_str());
  }
}

}  // namespace
}  // namespace dgmm::cuda
