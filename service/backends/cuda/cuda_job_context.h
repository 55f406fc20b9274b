// One job on one CudaDevice (internal to the CUDA backend): its device
// memory and the lanes that pipeline its pieces through staging, the kernel
// and back. CudaDevice::Begin makes it.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_CUDA_JOB_CONTEXT_H_
#define DGMM_SERVICE_BACKENDS_CUDA_CUDA_JOB_CONTEXT_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <future>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "service/backends/cuda/cuda_device.h"
#include "service/backends/cuda/dgmm_kernel.h"
#include "service/backends/cuda/tile_split.h"

namespace dgmm::cuda {

// Device allocations are aligned to this many bytes.
inline constexpr int64_t kAlign = 256;
inline int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// One job on one CudaDevice. Device memory: the diagonal, plus input and
// output regions (the whole matrix for kWhole, one slot per stream for
// kStreamed), all from the device's pool.
class CudaJobContext final : public JobContext {
 public:
  CudaJobContext(CudaDevice* device, const Problem& p, BackendKind backend, JobMode mode,
                 int64_t slot_bytes)
      : device_(device), p_(p), backend_(backend), mode_(mode), slot_bytes_(slot_bytes) {}
  ~CudaJobContext() override;

  // Allocates the job's device memory and uploads the diagonal.
  absl::Status Init(const std::byte* diag);

  absl::Status Process(const Tile& tile, const CancelFn& cancelled, StageTimes* times) override;

 private:
  // One piece in flight: its staging buffer (if any), stream and events.
  struct Lane {
    std::byte* staging = nullptr;
    int stream = 0;
    cudaEvent_t start = nullptr, uploaded = nullptr, computed = nullptr, done = nullptr;
    bool busy = false;
    Piece piece;
    // The copy of this lane's result out of its staging buffer, running on
    // a thread of its own while the next pieces are copied in: the buffer
    // is taken again only once it is done (AwaitCopyOut).
    struct CopyOut {
      absl::Status status;
      absl::Duration took;
    };
    std::future<CopyOut> copy_out;
  };

  // Device bytes of the input region (A's) and of the output region (C's,
  // more than A's when C's dtype is wider). Slots hold a piece of either:
  // pieces are cut so that their C fits a slot.
  int64_t region_bytes() const {
    return mode_ == JobMode::kWhole ? RoundUp(p_.matrix_bytes(), kAlign)
                                    : int64_t{device_->pieces_in_flight()} * slot_bytes_;
  }
  int64_t out_region_bytes() const {
    return mode_ == JobMode::kWhole ? RoundUp(p_.out_matrix_bytes(), kAlign)
                                    : int64_t{device_->pieces_in_flight()} * slot_bytes_;
  }
  // Device address of `piece`'s input (or, with `out`, output) in lane
  // `lane`.
  std::byte* DeviceAddress(std::byte* region, int lane, const Piece& piece, bool out = false) const;
  // `piece`'s offset and size in C's bytes (Piece's are A's).
  int64_t OutBytes(int64_t in_bytes) const {
    return in_bytes / static_cast<int64_t>(p_.elem_size()) *
           static_cast<int64_t>(p_.out_elem_size());
  }
  absl::Status Launch(const Lane& lane, const Piece& piece, int lane_index);
  absl::Status LaunchOn(std::byte* in, std::byte* out, const Piece& piece, int stream);
  // kDeviceRegion: the tile's pointers are device memory of this GPU.
  absl::Status ProcessResident(const Tile& tile, StageTimes* times);
  absl::Status Start(Lane& lane, int lane_index, const Piece& piece, const Tile& tile,
                     bool pinned_in, bool pinned_out, StageTimes* times);
  absl::Status Finish(Lane& lane, const Tile& tile, bool pinned_out, StageTimes* times);
  // Waits for `lane`'s copy out, if one runs, and returns how it went.
  absl::Status AwaitCopyOut(Lane& lane, StageTimes* times);
  template <typename T>
  DeviceTile<T> MakeDeviceTile(std::byte* in, std::byte* out, const Piece& piece) const;

  CudaDevice* const device_;
  const Problem p_;
  const BackendKind backend_;
  const JobMode mode_;
  const int64_t slot_bytes_;
  std::byte* d_diag_ = nullptr;
  std::byte* d_in_ = nullptr;
  std::byte* d_out_ = nullptr;
  std::vector<Lane> lanes_;
  // DGMM_TRACE_JOBS=1 in the server's environment: each job logs where its
  // host time went (set-up, the pipeline, tear-down), for benchmarks.
  absl::Time created_ = absl::Now();
  absl::Time initialized_, processed_, pipeline_start_, pipeline_end_;
  int64_t pieces_ = 0;
  // Where the pipeline's own thread spent its time: copying pieces into
  // staging, waiting for the GPU (a lane's last event), waiting for a
  // lane's copy out of staging; and the copies out themselves (their
  // threads', summed).
  absl::Duration copying_in_, waiting_gpu_, waiting_copy_out_, copying_out_;
};

}  // namespace dgmm::cuda

#endif  // DGMM_SERVICE_BACKENDS_CUDA_CUDA_JOB_CONTEXT_H_
