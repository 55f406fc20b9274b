// The shape of one multiply job and the vocabulary shared by every layer.
#ifndef DGMM_SERVICE_PROBLEM_H_
#define DGMM_SERVICE_PROBLEM_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dgmm {

enum class DType { kFloat32, kFloat64 };
enum class Layout { kRowMajor, kColMajor };
// kRight: C = A·diag(d) (columns scaled). kLeft: C = diag(d)·A (rows scaled).
enum class Side { kRight, kLeft };
// Concrete implementations; "auto" is resolved before a job reaches a device.
enum class BackendKind { kCpu, kCudaKernel, kCublas };

absl::string_view DTypeName(DType t);
absl::string_view LayoutName(Layout l);
absl::string_view SideName(Side s);
absl::string_view BackendName(BackendKind b);

inline constexpr std::size_t ElementSize(DType t) {
  return t == DType::kFloat32 ? 4 : 8;
}

// A validated job shape. The matrix is stored as `lines()` contiguous lines of
// `line_len()` elements: rows for row-major, columns for column-major. The
// diagonal either scales whole lines (scale_per_line(): row-major LEFT and
// column-major RIGHT) or the positions within each line (row-major RIGHT and
// column-major LEFT). Every backend works on this normalized form, so layout
// and side reduce to one boolean.
struct Problem {
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kRowMajor;
  Side side = Side::kRight;

  std::size_t elem_size() const { return ElementSize(dtype); }
  int64_t lines() const { return layout == Layout::kRowMajor ? rows : cols; }
  int64_t line_len() const { return layout == Layout::kRowMajor ? cols : rows; }
  bool scale_per_line() const {
    return (layout == Layout::kRowMajor) == (side == Side::kLeft);
  }
  int64_t diag_len() const { return side == Side::kRight ? cols : rows; }
  int64_t diag_bytes() const { return diag_len() * static_cast<int64_t>(elem_size()); }
  int64_t line_bytes() const { return line_len() * static_cast<int64_t>(elem_size()); }
  int64_t matrix_bytes() const { return lines() * line_bytes(); }
};

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

#endif  // DGMM_SERVICE_PROBLEM_H_
