// Factory for the GPU devices. Built only when CMake finds CUDA
// (DGMM_HAVE_CUDA); the engine falls back to the CPU otherwise.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_CUDA_DEVICES_H_
#define DGMM_SERVICE_BACKENDS_CUDA_CUDA_DEVICES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "service/device.h"

namespace dgmm {

struct CudaOptions {
  // CUDA streams per device; tiles of a job round-robin over them.
  int streams = 3;
  // Bytes of one pipeline tile (host staging buffer and device buffer).
  int64_t tile_bytes = int64_t{8} << 20;
};

// One Device per visible, usable GPU. An empty vector (not an error) when the
// host has no GPU or no driver; an error only for a GPU that is present but
// cannot be initialized. `why_none` receives a human-readable reason when the
// vector is empty.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateCudaDevices(
    const CudaOptions& options, std::string* why_none);

}  // namespace dgmm

#endif  // DGMM_SERVICE_BACKENDS_CUDA_CUDA_DEVICES_H_
