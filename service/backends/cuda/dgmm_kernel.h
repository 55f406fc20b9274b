// Host-side entry points of the diagonal-product kernels (dgmm_kernel.cu) and
// of cuBLAS dgmm (cublas_dgmm.cc), on the normalized tile form of
// service/core/problem.h. Plain CUDA types only, so that both .cc and .cu files
// (and the benchmark) can include this header.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_DGMM_KERNEL_H_
#define DGMM_SERVICE_BACKENDS_CUDA_DGMM_KERNEL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "service/core/scalar_types.h"

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

// ------------------------------------------- every dtype, two-sided

// A tile for the general kernel: read as TA, written as TC (TC = NumPy's
// result type of TA and the diagonals' types; KernelSupports(TA, TC)), with
// up to two diagonals in the compute type Compute<TC> (float for the half
// types). Each element is out = Narrow((left · in) · right), computed in
// Compute<TC> (service/core/scalar_types.h, docs/dtypes.md): `left`
// scales whole lines when left_per_line, else positions within a line, and
// `right` the other; a null diagonal is left out (one-sided), both null is
// cudaErrorInvalidValue. A per-line diagonal points at the scale of the
// tile's first line, a per-position one at position 0. `in` and `out` may be
// equal only when TA is TC. For C = diag(l)·A·diag(r): row-major lines are
// rows, so l is per line; column-major lines are columns, so l is per
// position; the order (l·a)·r is kept either way.
template <typename TA, typename TC = TA>
struct ScaleTile {
  const TA* in = nullptr;
  TC* out = nullptr;
  const Compute<TC>* left = nullptr;
  const Compute<TC>* right = nullptr;
  bool left_per_line = true;
  int64_t lines = 0;
  int64_t line_len = 0;
};

// The pairs (TA, TC) instantiated: every type with itself (float, double,
// Half, BFloat16, Complex64, Complex128) and every widening NumPy's
// promotion needs: Half and BFloat16 to float, double, Complex64 and
// Complex128; float to double, Complex64, Complex128; double and Complex64
// to Complex128.
//
// Vector width is 16 bytes / the wider of sizeof(TA), sizeof(TC) when `in`,
// `out` and a per-position diagonal are aligned to a whole vector and
// line_len is a multiple of it; else 1. float and double (same type) accept
// items_per_thread 1, 2 or 4 with either width; the other pairs accept
// items 1 with full vectors and 4 with width 1 (what ChooseScalePolicy
// picks); anything else is cudaErrorInvalidConfiguration.
template <typename TA, typename TC>
LaunchPolicy ChooseScalePolicy(const ScaleTile<TA, TC>& tile, int multiprocessors);
template <typename TA, typename TC>
cudaError_t LaunchScaleKernel(const ScaleTile<TA, TC>& tile, int multiprocessors,
                              cudaStream_t stream);
template <typename TA, typename TC>
cudaError_t LaunchScaleKernel(const ScaleTile<TA, TC>& tile, const LaunchPolicy& policy,
                              cudaStream_t stream);

// The same with the types chosen at run time (for the wiring): pointers are
// device memory of in_type, out_type and ComputeOf(out_type).
// cudaErrorInvalidValue when !KernelSupports(in_type, out_type).
struct AnyScaleTile {
  Scalar in_type = Scalar::kFloat32;
  Scalar out_type = Scalar::kFloat32;
  const void* in = nullptr;
  void* out = nullptr;
  const void* left = nullptr;
  const void* right = nullptr;
  bool left_per_line = true;
  int64_t lines = 0;
  int64_t line_len = 0;
};
cudaError_t LaunchScaleKernel(const AnyScaleTile& tile, int multiprocessors,
                              cudaStream_t stream);

// Whether cuBLAS has a dgmm for these types: S, D, C and Z dgmm, one
// diagonal of the same type as A and C. Half types, mixed types and
// two-sided scaling are not cuBLAS's (the wiring answers INVALID_ARGUMENT).
inline bool CublasDgmmSupports(Scalar in_type, Scalar out_type, bool two_sided) {
  return in_type == out_type && !two_sided && in_type != Scalar::kFloat16 &&
         in_type != Scalar::kBFloat16;
}

// Enqueues cuBLAS <t>dgmm on the handle's stream. The tile is a column-major
// matrix of line_len rows by `lines` columns, so per-line scaling is
// CUBLAS_SIDE_RIGHT and per-position scaling CUBLAS_SIDE_LEFT.
// T is float, double, Complex64 (cublasCdgmm) or Complex128 (cublasZdgmm).
template <typename T>
cublasStatus_t LaunchCublasDgmm(cublasHandle_t handle,
                                const DeviceTile<T>& tile);

}  // namespace dgmm::cuda

#endif  // DGMM_SERVICE_BACKENDS_CUDA_DGMM_KERNEL_H_
