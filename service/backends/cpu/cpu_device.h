// The CPU backend: a vectorized, multi-threaded diagonal product on host
// memory. Always present; the only backend on hosts without a GPU.
#ifndef DGMM_SERVICE_BACKENDS_CPU_CPU_DEVICE_H_
#define DGMM_SERVICE_BACKENDS_CPU_CPU_DEVICE_H_

#include <cstdint>
#include <memory>

#include "service/device.h"
#include "service/host_buffers.h"
#include "util/thread_pool.h"

namespace dgmm {

// Computes elements [begin, end) (in storage order) of a tile of `p`, where
// element e is at line e / line_len of the tile. Single-threaded; vectorized
// with the widest SIMD the running CPU has. `in` may equal `out`.
void ScaleRange(const Problem& p, const std::byte* diag, const Tile& tile,
                int64_t begin, int64_t end);

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

  // HostFootprint (service/engine/footprint.h): a CPU job computes in
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
