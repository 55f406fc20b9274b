// Factory for the GPU devices. Built only when CMake finds CUDA
// (DGMM_HAVE_CUDA); the engine falls back to the CPU otherwise.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_CUDA_DEVICES_H_
#define DGMM_SERVICE_BACKENDS_CUDA_CUDA_DEVICES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "service/core/device.h"

namespace dgmm {

struct CudaOptions {
  // CUDA streams per device (1..64); a job's pieces round-robin over them.
  int streams = 4;
  // Pieces of one job queued on the GPU at once (1..256); 0 means
  // 2 × streams. Deeper queues keep both copy engines busy (see
  // bench/results/kernel/h200_6b105dd/gpu_bench.md: the pipeline-shape sweep).
  int pieces_in_flight = 0;
  // Bytes of one pipeline piece, i.e. of one pinned host staging buffer and
  // of one device slot (at least 16). A streamed job holds
  // 2 × pieces_in_flight × min(tile_bytes, block) of device memory plus its
  // diagonal.
  int64_t tile_bytes = int64_t{8} << 20;
  // Pinned host staging buffers per device, shared by its jobs; 0 means
  // 2 × pieces_in_flight. Only jobs whose host memory is pageable use them.
  int staging_buffers = 0;
  // Order backends() by a short timing of both kernels on a few MB at start
  // (about 50 ms per device). When false, the custom kernel comes first.
  bool measure_backend_order = true;
};

// One Device per visible, usable GPU. An empty vector (not an error) when the
// host has no GPU or no driver; an error only for a GPU that is present but
// cannot be initialized, or for options out of range (INVALID_ARGUMENT).
// `why_none` receives a human-readable reason when the vector is empty.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateCudaDevices(
    const CudaOptions& options, std::string* why_none);

}  // namespace dgmm

#endif  // DGMM_SERVICE_BACKENDS_CUDA_CUDA_DEVICES_H_
