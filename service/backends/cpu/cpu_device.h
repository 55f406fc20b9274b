// The CPU backend: a vectorized, multi-threaded diagonal product on host
// memory. Always present; the only backend on hosts without a GPU.
#ifndef DGMM_SERVICE_BACKENDS_CPU_CPU_DEVICE_H_
#define DGMM_SERVICE_BACKENDS_CPU_CPU_DEVICE_H_

#include <cstdint>
#include <memory>

#include "service/core/scalar_types.h"
#include "service/core/device.h"
#include "service/core/host_buffers.h"
#include "util/thread_pool.h"

namespace dgmm {

// Computes elements [begin, end) (in storage order) of a tile of `p`, where
// element e is at line e / line_len of the tile. Single-threaded; vectorized
// with the widest SIMD the running CPU has. `in` may equal `out`.
void ScaleRange(const Problem& p, const std::byte* diag, const Tile& tile,
                int64_t begin, int64_t end);

// The kernel layer for every element type and for two-sided scaling (issue
// 27), in the tile form of service/core/problem.h. A tile of `lines` contiguous
// lines of `line_len` elements is read as `in_type` and written as
// `out_type` (KernelSupports(in_type, out_type) must hold; `in` may equal
// `out` only when the two types are equal). Each element is
//
//   out = Narrow((left · in) · right)
//
// computed in ComputeOf(out_type) (service/core/scalar_types.h), where
// `left` and `right` are diagonals in ComputeOf(out_type): one of them scales
// whole lines (indexed by first_line + the line within the tile) and the
// other positions within a line, as left_per_line says. A null diagonal is
// left out (one-sided scaling: out = Narrow(d · in)); both null is refused.
// For C = diag(l)·A·diag(r): row-major has l per line, column-major l per
// position; the order (l·a)·r is the user's, whatever the layout.
struct ScaleArgs {
  Scalar in_type = Scalar::kFloat32;
  Scalar out_type = Scalar::kFloat32;
  const std::byte* in = nullptr;   // the tile's first element
  std::byte* out = nullptr;
  const std::byte* left = nullptr;   // the whole diagonal, not offset
  const std::byte* right = nullptr;  // the whole diagonal, not offset
  bool left_per_line = true;
  int64_t first_line = 0;
  int64_t line_len = 0;
};

// Computes elements [begin, end) (storage order within the tile) of `args`.
// Single-threaded, vectorized like ScaleRange. False (and nothing written)
// when the types are not a supported pair, line_len <= 0 or both diagonals
// are null.
bool ScaleElements(const ScaleArgs& args, int64_t begin, int64_t end);

class CpuDevice : public Device {
 public:
  // `threads` <= 0 means one per hardware thread.
  explicit CpuDevice(int threads);

  int index() const override { return -1; }
  std::string name() const override;
  int64_t total_memory_bytes() const override { return total_memory_; }
  int64_t free_memory_at_start_bytes() const override { return free_at_start_; }
  int streams() const override { return pool_.size(); }
  std::vector<BackendKind> backends() const override { return {BackendKind::kCpu}; }
  bool in_service() const override { return true; }

  // HostFootprint (service/core/footprint.h): a CPU job computes in
  // its host block buffers and needs nothing beyond them.
  int64_t Footprint(const Problem& p, JobMode mode,
                    int64_t max_block_bytes) const override;

  absl::StatusOr<std::unique_ptr<JobContext>> Begin(
      const Problem& p, BackendKind backend, const std::byte* diag, JobMode mode,
      int64_t max_block_bytes) override;

  HostBufferPool& block_buffers() override { return *blocks_; }

 private:
  ThreadPool pool_;
  std::shared_ptr<HostBufferPool> blocks_ = HostBufferPool::CreateMapped(kBlockBufferCacheBytes);
  int64_t total_memory_ = 0;
  int64_t free_at_start_ = 0;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_BACKENDS_CPU_CPU_DEVICE_H_
