// The owner's side of a CUDA VMM region: an allocation made with cuMemCreate
// so that it can be exported as a POSIX file descriptor, mapped read/write
// in this process. The server only imports (CudaDevice::ImportVmmMemory);
// tests and benchmarks use this to play the client.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_VMM_EXPORT_H_
#define DGMM_SERVICE_BACKENDS_CUDA_VMM_EXPORT_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace dgmm::cuda {

class VmmAllocation {
 public:
  // At least `min_bytes` (rounded up to the allocation granularity) of
  // device memory on GPU `ordinal`, exportable as a POSIX descriptor, asked
  // for with CU_MEM_ALLOCATION_COMP_GENERIC when `compressible` (the driver
  // may still grant none: see compressed()). The calling thread's device
  // must be `ordinal`'s, with its primary context initialized.
  static absl::StatusOr<std::unique_ptr<VmmAllocation>> Create(int ordinal, int64_t min_bytes,
                                                               bool compressible = false);
  // Unmaps, frees the address range and releases the handle.
  ~VmmAllocation();
  VmmAllocation(const VmmAllocation&) = delete;
  VmmAllocation& operator=(const VmmAllocation&) = delete;

  std::byte* data() const { return reinterpret_cast<std::byte*>(va_); }
  // cuMemCreate's size: what the importer passes as allocation_bytes.
  int64_t bytes() const { return static_cast<int64_t>(bytes_); }
  int64_t granularity() const { return static_cast<int64_t>(granularity_); }
  // Whether the driver granted generic compression.
  bool compressed() const { return compressed_; }

  // A new descriptor for the allocation (cuMemExportToShareableHandle); the
  // caller closes it.
  absl::StatusOr<int> ExportFd() const;

 private:
  VmmAllocation() = default;

  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr va_ = 0;
  size_t bytes_ = 0;
  size_t granularity_ = 0;
  bool compressed_ = false;
  bool mapped_ = false;
};

}  // namespace dgmm::cuda

#endif  // DGMM_SERVICE_BACKENDS_CUDA_VMM_EXPORT_H_
