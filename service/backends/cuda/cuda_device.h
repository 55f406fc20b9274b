// One GPU as a Device: an executor with K CUDA streams (a cuBLAS handle
// bound to each), a ring of pinned host staging buffers shared by its jobs,
// and a stream-ordered memory pool that backs every job's device memory, so
// no job calls cudaMalloc or cudaFree.
//
// A job (CudaJobContext) moves its host tile through the device in pieces
// of at most tile_bytes: host → pinned staging (skipped when the host memory
// is already pinned) → device → kernel → host. Up to pieces_in_flight pieces
// are queued at once, round-robin over the K streams, so the upload of one
// piece overlaps the kernel of the one before and the download of the one
// before that, and the GPU never waits for the host to queue the next piece.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_CUDA_DEVICE_H_
#define DGMM_SERVICE_BACKENDS_CUDA_CUDA_DEVICE_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "service/backends/cuda/cuda_devices.h"
#include "service/core/device.h"
#include "service/core/host_buffers.h"
#include "util/thread_pool.h"

namespace dgmm::cuda {

// Pinned host buffers of one size, lent out to jobs. Thread-safe.
class StagingRing {
 public:
  // Allocates `count` buffers of `bytes` each with cudaHostAlloc on the
  // current device.
  static absl::StatusOr<std::unique_ptr<StagingRing>> Create(int count,
                                                             int64_t bytes);
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Takes between 1 and `want` buffers (want ≥ 1), waiting only while none
  // is free. A caller never waits while holding buffers, so no deadlock.
  std::vector<std::byte*> Acquire(int want);
  // Returns buffers taken by Acquire.
  void Release(const std::vector<std::byte*>& buffers);

  int64_t buffer_bytes() const { return bytes_; }
  int count() const { return static_cast<int>(all_.size()); }

 private:
  StagingRing(std::vector<std::byte*> buffers, int64_t bytes);

  const std::vector<std::byte*> all_;
  const int64_t bytes_;
  absl::Mutex mu_;
  std::vector<std::byte*> free_ ABSL_GUARDED_BY(mu_);
};

// A pool of pinned (page-locked, portable: any GPU can DMA to and from it)
// host buffers for blocks, keeping up to `max_cached_bytes` for reuse.
std::shared_ptr<HostBufferPool> NewPinnedBlockPool(
    int64_t max_cached_bytes = kBlockBufferCacheBytes);

class CudaDevice final : public Device {
 public:
  // Opens CUDA device `ordinal`: creates its streams, cuBLAS handles and
  // pool, and (if asked) times both backends to order them. Streamed blocks
  // come from `blocks` (GPUs of one host share one pool); null makes a pool
  // for this device. The staging ring is only allocated the first time a
  // job brings pageable host memory.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Open(
      int ordinal, const CudaOptions& options,
      std::shared_ptr<HostBufferPool> blocks = nullptr);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int index() const override { return ordinal_; }
  std::string name() const override { return name_; }
  int64_t total_memory_bytes() const override { return total_bytes_; }
  int64_t free_memory_at_start_bytes() const override { return free_at_start_; }
  int streams() const override { return static_cast<int>(streams_.size()); }
  std::vector<BackendKind> backends() const override { return backends_; }
  bool in_service() const override { return in_service_.load(); }

  // The single footprint function. Device bytes a job holds:
  //   kWhole:    matrix_bytes + out_matrix_bytes + prepared diagonals
  //              (input in A's dtype and output in C's on the device, every
  //              piece in its own place);
  //   kStreamed: 2 × pieces_in_flight × slot_bytes + prepared diagonals,
  //              where slot_bytes = min(tile_bytes, max_block_bytes) rounded
  //              up to 256 bytes: one input and one output slot per piece in
  //              flight, whatever the number of lines (a piece is cut so
  //              that its C, in C's wider dtype too, fits a slot).
  int64_t Footprint(const Problem& p, JobMode mode,
                    int64_t max_block_bytes) const override;

  // Begins a job. INVALID_ARGUMENT for a backend other than kCudaKernel or
  // kCublas; UNAVAILABLE once the device is out of service; INTERNAL for a
  // CUDA error (device memory exhausted included). The context must be
  // destroyed before the device.
  absl::StatusOr<std::unique_ptr<JobContext>> Begin(
      const Problem& p, BackendKind backend, const std::byte* diag,
      JobMode mode, int64_t max_block_bytes) override;

  HostBufferPool& block_buffers() override { return *blocks_; }
  absl::StatusOr<std::function<void()>> PinHostMemory(void* p, int64_t bytes) override;
  absl::StatusOr<IpcMapping> OpenIpcMemory(absl::string_view handle) override;
  // Imports the allocation behind `fd` (cuMemImportFromShareableHandle),
  // reserves an address range aligned to the allocation granularity, maps
  // all `allocation_bytes` of it and grants this GPU read and write access.
  // INVALID_ARGUMENT when `allocation_bytes` is not a positive multiple of
  // the granularity, when `fd` does not import (not a descriptor the CUDA
  // driver exported), names memory on another GPU, or does not map at
  // `allocation_bytes` (on an H200 with driver 580 a size larger or smaller
  // than cuMemCreate's did not map); FAILED_PRECONDITION when the driver or
  // the device cannot do it (no VMM, address space exhausted). `close`
  // unmaps, frees the range and releases the handle; call it once no job
  // uses the memory.
  absl::StatusOr<IpcMapping> ImportVmmMemory(int fd, int64_t allocation_bytes) override;

  // Beyond Device, for tests and the benchmark.
  int64_t tile_bytes() const { return tile_bytes_; }
  int pieces_in_flight() const { return pieces_in_flight_; }
  // Buffers of the staging ring (allocated on first use).
  int staging_buffers() const { return staging_count_; }
  int multiprocessors() const { return multiprocessors_; }
  // Most device-pool bytes in use at once since open or the last reset.
  absl::StatusOr<int64_t> PoolHighWaterBytes() const;
  absl::Status ResetPoolHighWater();

 private:
  friend class CudaJobContext;

  CudaDevice() = default;
  absl::Status Init(int ordinal, const CudaOptions& options);
  absl::Status OrderBackendsByTiming();
  int64_t SlotBytes(JobMode mode, const Problem& p,
                    int64_t max_block_bytes) const;
  // The staging ring, allocated by the first caller.
  absl::StatusOr<StagingRing*> Ring();
  // Copies between host memory that is not pinned (a region's first job)
  // and a staging buffer, on several threads: one thread's memcpy (and the
  // page faults of memory not touched yet) is slower than PCIe. With
  // `memory`, the host side is another process's (Tile.memory): `src` when
  // `into_staging`, else `dst`; its errors are returned.
  absl::Status StagingCopy(std::byte* dst, const std::byte* src, int64_t bytes,
                           const TileMemory* memory = nullptr, bool into_staging = true);

  // Records `err` (and takes the device out of service if it is sticky);
  // returns CudaStatus(err, what).
  absl::Status Check(cudaError_t err, std::string_view what);
  absl::Status Check(cublasStatus_t st, std::string_view what);
  // Makes this device current on the calling thread.
  absl::Status Enter();

  int ordinal_ = -1;
  std::string name_;
  int64_t total_bytes_ = 0;
  int64_t free_at_start_ = 0;
  int multiprocessors_ = 0;
  int64_t tile_bytes_ = 0;
  int pieces_in_flight_ = 0;
  std::vector<cudaStream_t> streams_;
  std::vector<cublasHandle_t> cublas_;   // cublas_[i] is bound to streams_[i]
  cudaStream_t setup_stream_ = nullptr;  // allocations and diagonal uploads
  cudaMemPool_t pool_ = nullptr;
  int staging_count_ = 0;
  absl::Mutex ring_mu_;
  std::unique_ptr<StagingRing> ring_ ABSL_GUARDED_BY(ring_mu_);
  std::shared_ptr<HostBufferPool> blocks_;
  std::unique_ptr<ThreadPool> copy_pool_;      // into staging
  std::unique_ptr<ThreadPool> copy_out_pool_;  // out of staging, at the same time
  std::vector<BackendKind> backends_ = {BackendKind::kCudaKernel,
                                        BackendKind::kCublas};
  std::atomic<bool> in_service_{true};
  std::atomic<uint32_t> next_stream_{0};
};

}  // namespace dgmm::cuda

#endif  // DGMM_SERVICE_BACKENDS_CUDA_CUDA_DEVICE_H_
