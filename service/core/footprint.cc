#include "service/core/footprint.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/core/enum_names.h"
#include "service/core/outcome.h"

namespace dgmm {

int64_t HostFootprint(const Problem& p, JobMode mode, int64_t max_block_bytes) {
  // The diagonals are held as the device gets them: widened to C's compute
  // type, both of them for SIDE_BOTH (Problem::prepared_diag_bytes).
  const int64_t diag = p.prepared_diag_bytes();
  if (mode == JobMode::kWhole) return p.matrix_bytes() + p.out_matrix_bytes() + diag;
  // A region job's matrix and result are in memory the client registered.
  if (mode == JobMode::kHostRegion || mode == JobMode::kDeviceRegion) return diag;
  return 2 * kStreamWindowBlocks * StreamBlockBytes(p, max_block_bytes) + diag;
}

int64_t StreamBlockBytes(const Problem& p, int64_t max_block_bytes) {
  // A block of A of at most max_block_bytes is a result block of its lines
  // in C's (never narrower) element size.
  return max_block_bytes / static_cast<int64_t>(p.elem_size()) *
         static_cast<int64_t>(p.out_elem_size());
}

const char* ModeName(JobMode mode) {
  static constexpr EnumName<JobMode> kNames[] = {{JobMode::kWhole, "unary"},
                                                 {JobMode::kStreamed, "streamed"},
                                                 {JobMode::kHostRegion, "host-region"},
                                                 {JobMode::kDeviceRegion, "cuda-ipc-region"}};
  return NameOf(kNames, mode);
}

namespace {

int64_t NeedOf(const Problem& p, JobMode mode, const TooLargeFacts& f) {
  return f.host_short ? HostFootprint(p, mode, f.max_block_bytes)
                      : f.device->Footprint(p, mode, f.max_block_bytes);
}

// The largest square matrix of p's dtype that fits the short budget in `mode`.
int64_t LargestSquare(const Problem& p, JobMode mode, const TooLargeFacts& f) {
  int64_t hi = f.max_dim;
  if (mode == JobMode::kStreamed) {
    hi = std::min<int64_t>(hi, f.max_block_bytes / static_cast<int64_t>(p.elem_size()));
  }
  int64_t lo = 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    Problem square = p;
    square.rows = square.cols = mid;
    if (NeedOf(square, mode, f) <= f.capacity) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace

absl::Status TooLargeError(const Problem& p, JobMode mode, const TooLargeFacts& f) {
  const std::string dtypes =
      p.out_dtype() == p.dtype
          ? std::string(DTypeName(p.dtype))
          : absl::StrCat(DTypeName(p.dtype), " with a ", DTypeName(p.out_dtype()), " result");
  std::string msg = absl::StrFormat(
      "job needs %d bytes of %s memory (%s %s %dx%d: %s) but the %s budget's capacity is %d "
      "bytes (%s); the largest square %s matrix that fits %s is N=%d.",
      f.need, f.host_short ? "host" : "GPU", ModeName(mode), dtypes, p.rows, p.cols,
      mode == JobMode::kWhole ? "input and output matrices plus diagonal"
                              : "streaming window plus diagonal",
      f.host_short ? "host" : absl::StrCat("GPU ", f.device->index()), f.capacity,
      f.host_short ? "--host_memory_budget" : "--gpu_memory_budget", DTypeName(p.dtype),
      ModeName(mode), LargestSquare(p, mode, f));
  if (mode == JobMode::kWhole) {
    const int64_t streamed = NeedOf(p, JobMode::kStreamed, f);
    if (streamed <= f.capacity && p.line_bytes() <= f.max_block_bytes) {
      absl::StrAppendFormat(&msg,
                            " Streamed, this job needs only %d bytes and fits: use "
                            "MultiplyStream (dgmm-cli and the dgmm clients stream large "
                            "matrices on their own).",
                            streamed);
    }
  }
  return WithOutcome(absl::ResourceExhaustedError(msg), Outcome::kTooLarge);
}

}  // namespace dgmm
