// Host-side entry points of the diagonal-product kernels (dgmm_kernel.cu) and
// of cuBLAS dgmm (cublas_dgmm.cc), on the normalized tile form of
// service/problem.h. Plain CUDA types only, so that both .cc and .cu files
// (and the benchmark) can include this header.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_DGMM_KERNEL_H_
#define DGMM_SERVICE_BACKENDS_CUDA_DGMM_KERNEL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dgmm::cuda {

// A tile in device memory: `lines` contiguous lines of `line_len` elements.
// out[l * line_len + j] = in[l * line_len + j] * diag[per_line ? l : j].
// When per_line is true, `diag` points at the scale of the tile's first line
// (the caller offsets it by first_line); otherwise at the scale of position 0
// within a line. `in` and `out` may be equal (in place) but must not overlap
// otherwise.
template <typename T>
struct DeviceTile {
  const T* in = nullptr;
  T* out = nullptr;
  const T* diag = nullptr;
  int64_t lines = 0;
  int64_t line_len = 0;
  bool per_line = false;
};

// Launch shape of the custom kernel, chosen by ChooseLaunchPolicy alone.
struct LaunchPolicy {
  int block_threads = 0;
  int grid_blocks = 0;
  int vector_width = 1;  // elements per 16-byte access; 1 = scalar fallback
  int items_per_thread = 0;
};

// The launch shape the custom kernel uses for `tile` on a device with
// `multiprocessors` SMs. Vector width is 16 bytes / sizeof(T) when `in`,
// `out` (and, per position, `diag`) are 16-byte aligned and line_len is a
// multiple of it; else 1.
template <typename T>
LaunchPolicy ChooseLaunchPolicy(const DeviceTile<T>& tile, int multiprocessors);

// Enqueues the custom kernel on `stream`. Returns the launch error, if any
// (cudaSuccess for an empty tile, which launches nothing).
template <typename T>
cudaError_t LaunchDgmmKernel(const DeviceTile<T>& tile, int multiprocessors,
                             cudaStream_t stream);

// As above with an explicit policy (the benchmark sweeps these). A policy's
// vector width must be 1 or one that ChooseLaunchPolicy would allow for this
// tile; items_per_thread must be 1, 2 or 4 (else
// cudaErrorInvalidConfiguration).
template <typename T>
cudaError_t LaunchDgmmKernel(const DeviceTile<T>& tile,
                             const LaunchPolicy& policy, cudaStream_t stream);

// Enqueues cuBLAS <t>dgmm on the handle's stream. The tile is a column-major
// matrix of line_len rows by `lines` columns, so per-line scaling is
// CUBLAS_SIDE_RIGHT and per-position scaling CUBLAS_SIDE_LEFT.
template <typename T>
cublasStatus_t LaunchCublasDgmm(cublasHandle_t handle,
                                const DeviceTile<T>& tile);

}  // namespace dgmm::cuda

#endif  // DGMM_SERVICE_BACKENDS_CUDA_DGMM_KERNEL_H_
