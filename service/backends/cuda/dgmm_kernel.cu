// The diagonal-product kernel: one template for both element types and both
// scaling modes. What is computed (DiagScale, a functor) is kept apart from
// how it is launched (LaunchPolicy, chosen in ChooseLaunchPolicy); Dispatch
// is the only place that knows both.
#include <algorithm>
#include <cstdint>

#include "service/backends/cuda/dgmm_kernel.h"

namespace dgmm::cuda {
namespace {

constexpr int kBlockThreads = 256;
// Blocks per SM the grid is sized for before the grid-stride loop takes
// over; more than fit at once, so the block scheduler evens out the tail.
constexpr int kBlocksPerSm = 32;
constexpr int kVectorBytes = 16;

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// Scales one vector of kVec elements that lies within one line. `line` is the
// line index within the tile, `pos` the element position within the line.
template <typename T, bool kPerLine>
struct DiagScale {
  const T* diag;

  template <int kVec>
  __device__ __forceinline__ void operator()(Vec<T, kVec>& x, int64_t line,
                                             int64_t pos) const {
    if constexpr (kPerLine) {
      const T s = __ldg(diag + line);
#pragma unroll
      for (int k = 0; k < kVec; ++k) x.v[k] *= s;
    } else {
      const Vec<T, kVec> s = *reinterpret_cast<const Vec<T, kVec>*>(diag + pos);
#pragma unroll
      for (int k = 0; k < kVec; ++k) x.v[k] *= s.v[k];
    }
  }
};

// Grid-stride over the tile as vectors of kVec elements (line_len is a
// multiple of kVec, so no vector straddles two lines). Each thread handles
// kItems vectors per step, blockDim.x apart, loading all before storing any.
// The (line, position) of each vector is advanced by addition with carry, so
// the loop does no 64-bit division.
template <typename T, int kVec, int kItems, typename Op>
__global__ void __launch_bounds__(kBlockThreads)
    DgmmKernel(const T* in, T* out, int64_t vectors, int64_t vectors_per_line,
               Op op) {
  using V = Vec<T, kVec>;
  const V* vin = reinterpret_cast<const V*>(in);
  V* vout = reinterpret_cast<V*>(out);
  const int64_t threads = blockDim.x;
  const int64_t grid_step = threads * kItems * gridDim.x;
  const int64_t thread_q = threads / vectors_per_line;
  const int64_t thread_r = threads % vectors_per_line;
  const int64_t grid_q = grid_step / vectors_per_line;
  const int64_t grid_r = grid_step % vectors_per_line;

  int64_t i = static_cast<int64_t>(blockIdx.x) * threads * kItems + threadIdx.x;
  int64_t line = i / vectors_per_line;
  int64_t pos = i - line * vectors_per_line;
  for (; i < vectors; i += grid_step) {
    V x[kItems];
    int64_t lines[kItems];
    int64_t positions[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      if (k == 0) {
        lines[k] = line;
        positions[k] = pos;
      } else {
        positions[k] = positions[k - 1] + thread_r;
        lines[k] = lines[k - 1] + thread_q;
        if (positions[k] >= vectors_per_line) {
          positions[k] -= vectors_per_line;
          ++lines[k];
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = i + k * threads;
      if (j < vectors) x[k] = vin[j];
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = i + k * threads;
      if (j < vectors) {
        op(x[k], lines[k], positions[k] * kVec);
        vout[j] = x[k];
      }
    }
    pos += grid_r;
    line += grid_q;
    if (pos >= vectors_per_line) {
      pos -= vectors_per_line;
      ++line;
    }
  }
}

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0;
}

template <typename T, int kVec, int kItems, bool kPerLine>
cudaError_t LaunchShape(const DeviceTile<T>& tile, const LaunchPolicy& policy,
                        cudaStream_t stream) {
  const int64_t vectors = tile.lines * tile.line_len / kVec;
  DgmmKernel<T, kVec, kItems>
      <<<policy.grid_blocks, policy.block_threads, 0, stream>>>(
          tile.in, tile.out, vectors, tile.line_len / kVec,
          DiagScale<T, kPerLine>{tile.diag});
  return cudaGetLastError();
}

template <typename T, int kVec, int kItems>
cudaError_t DispatchMode(const DeviceTile<T>& tile, const LaunchPolicy& policy,
                         cudaStream_t stream) {
  return tile.per_line ? LaunchShape<T, kVec, kItems, true>(tile, policy, stream)
                       : LaunchShape<T, kVec, kItems, false>(tile, policy, stream);
}

template <typename T, int kVec>
cudaError_t DispatchItems(const DeviceTile<T>& tile, const LaunchPolicy& policy,
                          cudaStream_t stream) {
  switch (policy.items_per_thread) {
    case 1:
      return DispatchMode<T, kVec, 1>(tile, policy, stream);
    case 2:
      return DispatchMode<T, kVec, 2>(tile, policy, stream);
    case 4:
      return DispatchMode<T, kVec, 4>(tile, policy, stream);
    default:
      return cudaErrorInvalidConfiguration;
  }
}

}  // namespace

template <typename T>
LaunchPolicy ChooseLaunchPolicy(const DeviceTile<T>& tile, int multiprocessors) {
  constexpr int kFullVector = kVectorBytes / sizeof(T);
  const bool vectorizable =
      tile.line_len % kFullVector == 0 && Aligned(tile.in) && Aligned(tile.out) &&
      (tile.per_line || Aligned(tile.diag));
  LaunchPolicy policy;
  policy.block_threads = kBlockThreads;
  policy.vector_width = vectorizable ? kFullVector : 1;
  // Two 16-byte loads in flight per thread cover the H200's latency at the
  // occupancy this kernel reaches; see bench/results for the sweep.
  policy.items_per_thread = vectorizable ? 2 : 4;
  const int64_t vectors = tile.lines * tile.line_len / policy.vector_width;
  const int64_t per_block = int64_t{kBlockThreads} * policy.items_per_thread;
  const int64_t needed = (vectors + per_block - 1) / per_block;
  const int64_t cap = int64_t{std::max(multiprocessors, 1)} * kBlocksPerSm;
  policy.grid_blocks = static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
  return policy;
}

template <typename T>
cudaError_t LaunchDgmmKernel(const DeviceTile<T>& tile, const LaunchPolicy& policy,
                             cudaStream_t stream) {
  if (tile.lines <= 0 || tile.line_len <= 0) return cudaSuccess;
  constexpr int kFullVector = kVectorBytes / sizeof(T);
  if (policy.vector_width == kFullVector) {
    return DispatchItems<T, kFullVector>(tile, policy, stream);
  }
  if (policy.vector_width == 1) return DispatchItems<T, 1>(tile, policy, stream);
  return cudaErrorInvalidConfiguration;
}

template <typename T>
cudaError_t LaunchDgmmKernel(const DeviceTile<T>& tile, int multiprocessors,
                             cudaStream_t stream) {
  return LaunchDgmmKernel(tile, ChooseLaunchPolicy(tile, multiprocessors), stream);
}

template LaunchPolicy ChooseLaunchPolicy<float>(const DeviceTile<float>&, int);
template LaunchPolicy ChooseLaunchPolicy<double>(const DeviceTile<double>&, int);
template cudaError_t LaunchDgmmKernel<float>(const DeviceTile<float>&,
                                             const LaunchPolicy&, cudaStream_t);
template cudaError_t LaunchDgmmKernel<double>(const DeviceTile<double>&,
                                              const LaunchPolicy&, cudaStream_t);
template cudaError_t LaunchDgmmKernel<float>(const DeviceTile<float>&, int,
                                             cudaStream_t);
template cudaError_t LaunchDgmmKernel<double>(const DeviceTile<double>&, int,
                                              cudaStream_t);

}  // namespace dgmm::cuda
