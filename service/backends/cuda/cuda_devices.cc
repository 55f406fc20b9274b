#include "service/backends/cuda/cuda_devices.h"

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "service/backends/cuda/cuda_device.h"

namespace dgmm {

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateCudaDevices(
    const CudaOptions& options, std::string* why_none) {
  if (options.streams < 1 || options.streams > 64) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA streams per device must be in [1, 64], got %d", options.streams));
  }
  if (options.pieces_in_flight < 0 || options.pieces_in_flight > 256) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA pieces in flight must be in [0, 256] (0: 2 per stream), got %d",
        options.pieces_in_flight));
  }
  if (options.tile_bytes < 16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA tile bytes must be at least 16, got %d", options.tile_bytes));
  }
  if (options.staging_buffers < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "staging buffers must be 0 (2 per stream) or more, got %d",
        options.staging_buffers));
  }
  std::vector<std::unique_ptr<Device>> devices;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why_none != nullptr) {
      *why_none =
          absl::StrFormat("no usable CUDA driver or device: %s (%s)",
                          cudaGetErrorString(err), cudaGetErrorName(err));
    }
    return devices;
  }
  if (count == 0) {
    if (why_none != nullptr) *why_none = "no CUDA device is visible";
    return devices;
  }
  // One pool of pinned block buffers for all GPUs (pinned portable memory
  // serves any), keeping as much for reuse per GPU as one device would:
  // freeing pinned memory synchronizes with the device, so it should be rare.
  std::shared_ptr<HostBufferPool> blocks =
      cuda::NewPinnedBlockPool(kBlockBufferCacheBytes * count);
  for (int i = 0; i < count; ++i) {
    auto device = cuda::CudaDevice::Open(i, options, blocks);
    if (!device.ok()) {
      return absl::Status(device.status().code(),
                          absl::StrFormat("opening CUDA device %d: %s", i,
                                          device.status().message()));
    }
    devices.push_back(std::move(*device));
  }
  return devices;
}

}  // namespace dgmm
