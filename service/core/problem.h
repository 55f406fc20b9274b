// The shape of one multiply job and the vocabulary shared by every layer.
#ifndef DGMM_SERVICE_CORE_PROBLEM_H_
#define DGMM_SERVICE_CORE_PROBLEM_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "service/core/scalar_types.h"

namespace dgmm {

// Element types (docs/dtypes.md): the kernel layer's Scalar under
// the name the rest of the service uses (DType::kFloat32 is
// Scalar::kFloat32).
using DType = Scalar;
enum class Layout { kRowMajor, kColMajor };
// kRight: C = A·diag(d) (columns scaled). kLeft: C = diag(d)·A (rows scaled).
// kBoth: C = diag(l)·A·diag(r), element (i, j) = (l[i]·a)·r[j].
enum class Side { kRight, kLeft, kBoth };
// Concrete implementations; "auto" is resolved before a job reaches a device.
enum class BackendKind { kCpu, kCudaKernel, kCublas };

absl::string_view DTypeName(DType t);
absl::string_view LayoutName(Layout l);
absl::string_view SideName(Side s);
absl::string_view BackendName(BackendKind b);

inline constexpr std::size_t ElementSize(DType t) {
  return static_cast<std::size_t>(ScalarSize(t));
}

// Where the right diagonal starts in a job's prepared diagonals (see
// Problem::prepared_diag_bytes): aligned for any vector load.
inline constexpr int64_t kPreparedDiagAlign = 256;

// A validated job shape. The matrix is stored as `lines()` contiguous lines of
// `line_len()` elements: rows for row-major, columns for column-major. A
// diagonal either scales whole lines (scale_per_line(): row-major LEFT and
// column-major RIGHT) or the positions within each line (row-major RIGHT and
// column-major LEFT); with kBoth the left diagonal scales lines when
// row-major and the right one the positions (the other way round
// column-major). Every backend works on this normalized form.
//
// Element types: `dtype` is A's, diag_dtype() the diagonals' (as sent) and
// out_dtype() C's, NumPy's result type of the two or wider
// (KernelSupports). The sizes below without a prefix are A's (elem_size,
// line_bytes, matrix_bytes); C's have out_. C may be wider than A (a
// promoted result): a path that computes in place (one buffer per block)
// must hold only when out_elem_size() == elem_size(), and code that moves
// C's bytes uses the out_ sizes.
struct Problem {
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kRowMajor;
  Side side = Side::kRight;
  // Unset: `dtype` (so that Problem{rows, cols, dtype, layout, side} is
  // the one-dtype job it always was).
  std::optional<DType> diagonal_dtype = std::nullopt;
  std::optional<DType> result_dtype = std::nullopt;

  DType diag_dtype() const { return diagonal_dtype.value_or(dtype); }
  DType out_dtype() const { return result_dtype.value_or(dtype); }

  std::size_t elem_size() const { return ElementSize(dtype); }
  std::size_t out_elem_size() const { return ElementSize(out_dtype()); }
  std::size_t diag_elem_size() const { return ElementSize(diag_dtype()); }
  int64_t lines() const { return layout == Layout::kRowMajor ? rows : cols; }
  int64_t line_len() const { return layout == Layout::kRowMajor ? cols : rows; }
  // One-sided jobs: whether the diagonal scales whole lines.
  bool scale_per_line() const {
    return (layout == Layout::kRowMajor) == (side == Side::kLeft);
  }
  bool two_sided() const { return side == Side::kBoth; }
  bool has_left() const { return side != Side::kRight; }
  bool has_right() const { return side != Side::kLeft; }
  // Whether the left diagonal (rows) scales whole lines: row-major.
  bool left_per_line() const { return layout == Layout::kRowMajor; }
  // The one diagonal of a one-sided job (kBoth: the left one, `rows`).
  int64_t diag_len() const { return side == Side::kRight ? cols : rows; }
  // Wire bytes of the diagonal(s) in diag_dtype(): the one diagonal, or the
  // left (diag_bytes) and right (right_diag_bytes) of kBoth.
  int64_t diag_bytes() const { return diag_len() * static_cast<int64_t>(diag_elem_size()); }
  int64_t right_diag_bytes() const {
    return two_sided() ? cols * static_cast<int64_t>(diag_elem_size()) : 0;
  }
  int64_t line_bytes() const { return line_len() * static_cast<int64_t>(elem_size()); }
  int64_t matrix_bytes() const { return lines() * line_bytes(); }
  int64_t out_line_bytes() const { return line_len() * static_cast<int64_t>(out_elem_size()); }
  int64_t out_matrix_bytes() const { return lines() * out_line_bytes(); }

  // The plain float32/float64 one-sided job of the original service: one
  // dtype everywhere (the fast paths and cuBLAS S/D dgmm take it as is).
  bool plain() const {
    return !two_sided() && dtype == diag_dtype() && dtype == out_dtype() &&
           (dtype == DType::kFloat32 || dtype == DType::kFloat64);
  }

  // The diagonals as the devices get them (Device::Begin): widened to
  // ComputeOf(out_dtype()), the left one (kLeft, kBoth) or the one (kRight)
  // at 0, and for kBoth the right one at right_diag_offset().
  std::size_t compute_elem_size() const { return ElementSize(ComputeOf(out_dtype())); }
  int64_t right_diag_offset() const {
    const int64_t first = diag_len() * static_cast<int64_t>(compute_elem_size());
    return (first + kPreparedDiagAlign - 1) / kPreparedDiagAlign * kPreparedDiagAlign;
  }
  int64_t prepared_diag_bytes() const {
    return two_sided() ? right_diag_offset() + cols * static_cast<int64_t>(compute_elem_size())
                       : diag_len() * static_cast<int64_t>(compute_elem_size());
  }
};

// Whether cuBLAS has a dgmm for `p` (S, D, C and Z dgmm: one dtype, not a
// half type, for A, the diagonal and C; one side). The CUDA backend's
// CublasDgmmSupports says the same of a tile.
inline bool CublasTakes(const Problem& p) {
  return p.dtype == p.diag_dtype() && p.dtype == p.out_dtype() && !p.two_sided() &&
         p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16;
}

// The prepared diagonals of `p` (Problem::prepared_diag_bytes bytes): `left`
// (or the one diagonal) and, for kBoth, `right`, each of diag_dtype(),
// widened exactly to ComputeOf(out_dtype()). The lengths must be
// diag_bytes() and right_diag_bytes() (the validator checked them).
std::string PrepareDiagonals(const Problem& p, absl::string_view diagonal,
                             absl::string_view right_diagonal);

// Host memory that is not the server's: a tile whose `memory` is set has
// `in` and `out` in another process (a client's own memory, named by
// RegionRef.process_address), and the backends copy through it, in pieces
// of their choosing, instead of touching `in` and `out`. Thread-safe.
class TileMemory {
 public:
  virtual ~TileMemory() = default;
  // Copies `bytes` from the other process's `src` into `dst` (ours).
  virtual absl::Status Read(std::byte* dst, const std::byte* src, int64_t bytes) const = 0;
  // Copies `bytes` from our `src` to the other process's `dst`.
  virtual absl::Status Write(std::byte* dst, const std::byte* src, int64_t bytes) const = 0;
};

// Lines [first_line, first_line + lines) of a problem's matrix. `in` and `out`
// point at the tile's first element (not the matrix's) and may be equal (in
// place). Both are host memory: this process's, or, with `memory`, another
// process's.
struct Tile {
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  int64_t first_line = 0;
  int64_t lines = 0;
  const TileMemory* memory = nullptr;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_PROBLEM_H_
