// A place jobs run: the CPU or one GPU. The engine owns one Device per GPU
// (service/backends/cuda) and one for the CPU (service/backends/cpu); the
// handlers and the admission layer see only this interface.
#ifndef DGMM_SERVICE_CORE_DEVICE_H_
#define DGMM_SERVICE_CORE_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "service/core/problem.h"

namespace dgmm {

class HostBufferPool;  // service/core/host_buffers.h

// How a job hands its matrix to a device: all at once (Multiply), as a
// sequence of blocks of at most `max_block_bytes` (MultiplyStream), from a
// registered host region in one tile that the device pipelines itself
// (MultiplyRegion on shared memory: device tiles only, no host copy), or in
// device memory the job does not own (MultiplyRegion on CUDA IPC regions:
// tile pointers are device addresses on the job's GPU; nothing is copied).
enum class JobMode { kWhole, kStreamed, kHostRegion, kDeviceRegion };

// Time spent per stage, summed over a job's tiles. Stages of different tiles
// overlap, so the sum may exceed the job's wall time.
struct StageTimes {
  absl::Duration h2d;
  absl::Duration compute;
  absl::Duration d2h;
};

// Polled between tiles; true ends the job early with CANCELLED.
using CancelFn = std::function<bool()>;

// One job's state on one device (device copy of the diagonal, its slice of
// the memory pool). Created by Device::Begin after admission; destroyed when
// the job ends, whatever the outcome. Not thread-safe: one Process at a time.
class JobContext {
 public:
  virtual ~JobContext() = default;

  // Computes `tile` of the job's problem: out = scaled(in). Blocks until the
  // result is in tile.out. Tiles may come in any order and any size up to the
  // size the job was begun with (the whole matrix for kWhole, max_block_bytes
  // for kStreamed). Returns INTERNAL with the CUDA/cuBLAS error text on device
  // failure, CANCELLED when `cancelled` turned true.
  virtual absl::Status Process(const Tile& tile, const CancelFn& cancelled,
                               StageTimes* times) = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // -1 for the CPU, else the CUDA device ordinal.
  virtual int index() const = 0;
  // "cpu" or the GPU's product name.
  virtual std::string name() const = 0;
  // Bytes of memory this device has (host RAM for the CPU).
  virtual int64_t total_memory_bytes() const = 0;
  // Bytes free when the device was opened (MemAvailable for the CPU): the
  // base of a percentage budget.
  virtual int64_t free_memory_at_start_bytes() const = 0;
  // CUDA streams, or worker threads for the CPU.
  virtual int streams() const = 0;
  // Backends this device runs; the first one is what BACKEND_AUTO picks.
  virtual std::vector<BackendKind> backends() const = 0;
  // False once a sticky error has taken the device out of service.
  virtual bool in_service() const = 0;

  // Bytes of this device's budget a job holds while admitted. Computed from
  // the shape alone. kWhole: what the whole-matrix job holds (input and output
  // matrices plus diagonal). kStreamed: a fixed tile working set that does not
  // grow with the number of lines. The host side of every job (its payload
  // in host memory) is HostFootprint (service/core/footprint.h),
  // which the engine reserves from the host budget for every job.
  virtual int64_t Footprint(const Problem& p, JobMode mode,
                            int64_t max_block_bytes) const = 0;

  // Prepares a job: copies the diagonal (diag_bytes() bytes at `diag`) and
  // takes the job's working memory. The admission layer has already reserved
  // Footprint() bytes of budget for it.
  virtual absl::StatusOr<std::unique_ptr<JobContext>> Begin(
      const Problem& p, BackendKind backend, const std::byte* diag,
      JobMode mode, int64_t max_block_bytes) = 0;

  // Host memory for the blocks of streamed jobs on this device, received
  // into and sent from without further copies: pinned for a GPU (no staging
  // copy on the way to and from it), plain pages for the CPU.
  virtual HostBufferPool& block_buffers() = 0;

  // Regions (service/regions). Makes host memory DMA-able for this device
  // (cudaHostRegister, portable to every GPU) and returns what undoes it;
  // the CPU has nothing to do.
  virtual absl::StatusOr<std::function<void()>> PinHostMemory(void* p, int64_t bytes) {
    return std::function<void()>([] {});
  }
  // Opens another process's CUDA IPC handle (64 bytes) on this GPU: the
  // allocation's base address, its size in bytes and what closes it.
  struct IpcMapping {
    std::byte* base = nullptr;
    int64_t bytes = 0;
    std::function<void()> close;
  };
  virtual absl::StatusOr<IpcMapping> OpenIpcMemory(absl::string_view handle) {
    return absl::FailedPreconditionError("the CPU cannot open CUDA IPC memory");
  }
  // Imports a CUDA VMM allocation of `allocation_bytes` that another process
  // exported as a POSIX file descriptor (cuMemExportToShareableHandle),
  // maps it on this GPU with read and write access: its base, its size and
  // what unmaps and releases it. `fd` stays the caller's to close.
  virtual absl::StatusOr<IpcMapping> ImportVmmMemory(int fd, int64_t allocation_bytes) {
    return absl::FailedPreconditionError("the CPU cannot import CUDA VMM memory");
  }
};

// Bytes of returned block buffers a device's pool keeps for reuse.
inline constexpr int64_t kBlockBufferCacheBytes = int64_t{64} << 20;

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_DEVICE_H_
